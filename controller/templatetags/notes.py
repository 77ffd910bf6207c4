"""``{% notes_draft action as draft %}``: what the tags-and-note form held when its last post
was refused (controller/runs_views.py, ``annotate``), taken once from the session, so the form
shows the typed values and the reason instead of the stored ones."""

from django import template

register = template.Library()
SESSION_KEY = "notes_draft"


@register.simple_tag(takes_context=True)
def notes_draft(context, action: str) -> dict | None:
    request = context.get("request")
    session = getattr(request, "session", None)
    if session is None or (session.get(SESSION_KEY) or {}).get("action") != action:
        return None
    return session.pop(SESSION_KEY)
