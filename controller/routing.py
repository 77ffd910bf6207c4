"""The websocket routes: one live socket per run page."""

from django.urls import path

from controller.live.consumers import RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
