// Muster console: live status by polling a server-rendered fragment, and log follow.
// Plain JS served from the project's own static files (no CDN, no framework).
(function () {
  "use strict";
  var POLL_MS = 2000;

  function get(url, asJson) {
    return fetch(url, {credentials: "same-origin", headers: {"X-Requested-With": "fetch"}}).then(function (r) {
      if (!r.ok) {
        var err = new Error(url + ": HTTP " + r.status);
        // 429: the server's rate per user (MUSTER_THROTTLE_USER); wait as long as it says
        err.retryMs = 1000 * (parseInt(r.headers.get("Retry-After"), 10) || 0);
        throw err;
      }
      return asJson ? r.json() : r.text();
    });
  }

  var status = document.getElementById("run-status");
  if (status) {
    var pollStatus = function () {
      get(status.dataset.poll, false).then(function (html) {
        status.innerHTML = html;
        var head = document.getElementById("run-head");
        if (!head || head.dataset.finished !== "1") { setTimeout(pollStatus, POLL_MS); }
      }).catch(function () { setTimeout(pollStatus, POLL_MS * 2); });
    };
    var head = document.getElementById("run-head");
    if (!head || head.dataset.finished !== "1") { setTimeout(pollStatus, POLL_MS); }
  }

  var select = document.getElementById("log-job");
  var text = document.getElementById("log-text");
  var follow = document.getElementById("log-follow");
  if (select && text) {
    var offset = 0, generation = 0, timer = null;
    var readLog = function (gen) {
      var url = select.dataset.log + "?job=" + encodeURIComponent(select.value) + "&start=" + offset;
      get(url, true).then(function (body) {
        if (gen !== generation) { return; }
        if (body.text) {
          var atBottom = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
          text.appendChild(document.createTextNode(body.text));
          if (atBottom && follow && follow.checked) { text.scrollTop = text.scrollHeight; }
        }
        offset = body.next;
        text.dataset.jobStatus = body.status;
        // keep reading while the job may still print or a chunk came back full
        if (follow && follow.checked && (!body.finished || body.text)) {
          timer = setTimeout(function () { readLog(gen); }, body.text ? 200 : POLL_MS);
        }
      }).catch(function (err) {
        timer = setTimeout(function () { readLog(gen); }, Math.max(POLL_MS * 2, (err && err.retryMs) || 0));
      });
    };
    var restart = function () {
      generation += 1; offset = 0; text.textContent = "";
      if (timer) { clearTimeout(timer); }
      readLog(generation);
    };
    select.addEventListener("change", restart);
    if (follow) {
      follow.addEventListener("change", function () {
        if (follow.checked) { if (timer) { clearTimeout(timer); } readLog(generation); }
      });
    }
    restart();
  }
})();
