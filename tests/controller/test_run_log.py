"""The learner's log on the run page: its tail in every (re)connect replay, the file as a download."""

import pytest

from controller.supervision.runlog import log_path, log_tail

from .test_consumers import connect, receive_until_replay_done


def write_log(run, lines: list[str]) -> None:
    path = log_path(run.pk)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))


@pytest.mark.django_db(transaction=True)
async def test_the_replay_sends_the_last_log_lines_with_their_numbers(alice_run, alice, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    from channels.db import database_sync_to_async

    await database_sync_to_async(write_log)(alice_run, [f"line {i}" for i in range(250)])
    communicator, connected, _ = await connect(alice_run, user=alice)
    assert connected
    frames = await receive_until_replay_done(communicator)
    [log] = [f for f in frames if f["type"] == "log"]
    assert log["first"] == 50 and log["lines"] == [f"line {i}" for i in range(50, 250)]
    assert [f["type"] for f in frames][-3:] == ["log", "status", "replay_done"]
    await communicator.disconnect()


def test_a_partly_written_last_line_waits_for_its_newline(alice_run, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    write_log(alice_run, ["a", "b"])
    with open(log_path(alice_run.pk), "a") as fh:
        fh.write("half a li")
    assert log_tail(alice_run.pk) == (0, ["a", "b"])


def test_the_full_log_downloads_for_its_owner_only(alice_run, alice_client, bob_client, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    url = f"/runs/{alice_run.pk}/log/"
    empty = alice_client.get(url)  # before the learner wrote anything
    assert empty.status_code == 200 and empty.content == b""
    write_log(alice_run, ["boot: starting 1 rollout worker(s)", "step   0  reward 0.300"])
    response = alice_client.get(url)
    assert response.status_code == 200
    assert f'filename="run-{alice_run.pk}-learner.log"' in response["Content-Disposition"]
    assert b"".join(response.streaming_content).decode().splitlines()[1] == "step   0  reward 0.300"
    assert bob_client.get(url).status_code == 404


def test_a_log_that_is_not_a_regular_file_is_never_read(alice_run, alice_client, settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    path = log_path(alice_run.pk)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/full")  # endless zeros when read
    assert log_tail(alice_run.pk) == (0, [])
    response = alice_client.get(f"/runs/{alice_run.pk}/log/")
    assert response.status_code == 200 and response.content == b""
