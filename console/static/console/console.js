// Muster console: live status by polling a server-rendered fragment, and log follow.
// Plain JS served from the project's own static files (no CDN, no framework).
(function () {
  "use strict";
  var POLL_MS = 2000;
  var ALL_JOBS_MAX = 16;

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
  var download = document.getElementById("log-download");
  var note = document.getElementById("log-note");
  if (select && text) {
    // one reader per job shown: its offset, and the start of a line that has not ended yet
    var readers = [], generation = 0, timer = null, shown = false;
    var clock = function () { return new Date().toTimeString().slice(0, 8); };
    var showEmpty = function () {
      if (!shown) { text.textContent = text.dataset.empty; text.classList.add("empty"); }
    };
    var append = function (chunk) {
      if (!shown) { text.textContent = ""; text.classList.remove("empty"); shown = true; }
      var atBottom = text.scrollTop + text.clientHeight >= text.scrollHeight - 4;
      text.appendChild(document.createTextNode(chunk));
      if (atBottom && follow && follow.checked) { text.scrollTop = text.scrollHeight; }
    };
    // [ms, lines] runs (the answer's `times`: when each line beginning in its text was written) expanded
    var expand = function (runs) {
      var out = [];
      (runs || []).forEach(function (run) { for (var i = 0; i < run[1] && i < 1048576; i++) { out.push(run[0]); } });
      return out;
    };
    var stampOf = function (ms) {
      return ms ? new Date(ms).toTimeString().slice(0, 8) : clock();  // a copy without times: when read
    };
    // the chunk cut into lines, each with its time; reader.rest is a line begun and not ended yet
    var timedLines = function (reader, chunk, runs, ended) {
      var times = expand(runs), next = 0, out = [];
      var pieces = chunk.split("\n");
      for (var i = 0; i < pieces.length; i++) {
        var ending = i < pieces.length - 1, piece = pieces[i], ms;
        if (i === 0 && reader.restMs !== null) { ms = reader.restMs; piece = reader.rest + piece; }
        else if (!ending && !piece) { break; }
        else { ms = next < times.length ? times[next++] : 0; }
        if (ending) { out.push({ms: ms, line: piece}); reader.rest = ""; reader.restMs = null; }
        else { reader.rest = piece; reader.restMs = ms; }
      }
      if (ended && reader.restMs !== null) {
        out.push({ms: reader.restMs, line: reader.rest}); reader.rest = ""; reader.restMs = null;
      }
      return out.map(function (l) {
        return {ms: l.ms, text: "[" + reader.prefix + "] " + stampOf(l.ms) + " " + l.line + "\n"};
      });
    };
    var pending = [];
    var readOne = function (reader) {
      var url = select.dataset.log + "?job=" + encodeURIComponent(reader.job) + "&start=" + reader.offset;
      return get(url, true).then(function (body) {
        reader.offset = body.next;
        reader.finished = body.finished && !body.text;
        reader.more = !!body.text;
        var chunk = body.text || "";
        if (reader.prefix) {
          // every job's lines of one pass are shown together, in the order they were written
          pending = pending.concat(timedLines(reader, chunk, body.times, reader.finished));
        } else if (chunk) { append(chunk); }
        text.dataset.jobStatus = body.status;
      });
    };
    var showPending = function () {
      var lines = pending.map(function (l, i) { return [l.ms, i, l.text]; });
      lines.sort(function (a, b) { return a[0] - b[0] || a[1] - b[1]; });
      pending = [];
      if (lines.length) { append(lines.map(function (l) { return l[2]; }).join("")); }
    };
    var readLog = function (gen) {
      // one request at a time, job after job: a run of many nodes costs the server one log read
      // in flight per viewer (and the viewer's rate, MUSTER_THROTTLE_USER), not one per node at once
      readers.reduce(function (done, reader) {
        return done.then(function () { return reader.finished ? null : readOne(reader); });
      }, Promise.resolve()).then(function () {
        if (gen !== generation) { return; }
        showPending();
        showEmpty();
        var more = readers.some(function (r) { return r.more; });
        // keep reading while a job may still print or a chunk came back full
        var open = readers.some(function (r) { return !r.finished; });
        if (follow && follow.checked && (open || more)) {
          timer = setTimeout(function () { readLog(gen); }, more ? 200 : POLL_MS);
        }
      }).catch(function (err) {
        if (gen === generation) {
          timer = setTimeout(function () { readLog(gen); }, Math.max(POLL_MS * 2, (err && err.retryMs) || 0));
        }
      });
    };
    var restart = function () {
      generation += 1; shown = false; text.textContent = ""; pending = [];
      if (timer) { clearTimeout(timer); }
      var all = select.value === "all";
      readers = Array.prototype.filter.call(select.options, function (o) {
        return o.value !== "all" && (all || o.value === select.value);
      }).map(function (o) {
        return {job: o.value, offset: 0, rest: "", restMs: null, prefix: all ? o.dataset.prefix : "", finished: false, more: false};
      });
      if (download) { download.href = download.dataset.base + (all ? "" : "?job=" + encodeURIComponent(select.value)); }
      if (note) { note.hidden = !all; }
      readLog(generation);
    };
    // every job's log at once is the default for a run of a few nodes; a big one opens on its master
    if (select.options.length > ALL_JOBS_MAX + 1) { select.value = select.options[1].value; }
    select.addEventListener("change", restart);
    if (follow) {
      follow.addEventListener("change", function () {
        if (follow.checked) { if (timer) { clearTimeout(timer); } readLog(generation); }
      });
    }
    restart();
  }
})();
