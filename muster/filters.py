"""What the apps' FilterSets (each app's api/filters.py) share."""

from __future__ import annotations

import django_filters


def enum_filter(enum, word: str, help_text: str) -> django_filters.ChoiceFilter:
    """A query parameter that takes one value of a TextChoices enum. A wrong value is a 400 whose
    message names the values there are, which Django's own "select a valid choice" does not."""
    return django_filters.ChoiceFilter(
        choices=enum.choices, help_text=help_text,
        error_messages={"invalid_choice": f"unknown {word}; one of {', '.join(enum.values)}"},
    )
