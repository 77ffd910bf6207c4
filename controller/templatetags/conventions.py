"""``{% conventions_json %}``: the span kinds and metric names of ``learner.timeline`` as a JSON
script element, so the pages' JavaScript (static/js/conventions.js) names them as the learner
does instead of keeping its own copy (docs/spans.md)."""

from django import template
from django.utils.html import json_script

from learner.timeline import conventions

register = template.Library()


@register.simple_tag
def conventions_json() -> str:
    return json_script(conventions(), "ts-conventions")
