"""A trajectory's record: its tokens split into prompt / turns / observations in order, tool calls
marked, texts bounded with the cut named, advantages and the zero-gradient flag as the learner's."""

from learner.config import AlgorithmConfig
from learner.driver.trajectory_records import SEGMENT_CHARS, TRAJECTORY_CHARS, segments, trajectory_events
from learner.trajectory import Trajectory


class Letters:
    """A tokenizer whose token k decodes to the letter 'a' + k % 26."""

    def decode(self, ids, **_):
        return "".join(chr(97 + i % 26) for i in ids)


def traj(i, group, reward, prompt=3, turns=((2, 1), (3, 0)), drafted=()):
    ids, mask, spans = list(range(prompt)), [0] * prompt, []
    for n, obs in turns:
        spans.append((len(ids), len(ids) + n))
        ids, mask = ids + [7] * n, mask + [1] * n
        ids, mask = ids + [14] * obs, mask + [0] * obs
    return Trajectory(id=i, group=group, step=0, input_ids=ids, loss_mask=mask, behavior_logprobs=[0.0] * len(ids),
                      reward=reward, turn_versions=[0] * len(spans), turn_spans=spans, drafted_versions=list(drafted))


def test_segments_follow_the_tokens_and_mark_tool_calls():
    segs = segments(traj(0, 0, 1.0, drafted=(-1, 3)), Letters().decode)
    assert [(s["role"], s["text"], s.get("tool_call")) for s in segs] == [
        ("prompt", "abc", None), ("turn", "hh", True), ("observation", "o", None), ("turn", "hhh", False)]
    assert segs[3]["drafted_by"] == 3 and "drafted_by" not in segs[1] and not any(s["cut"] for s in segs)


def test_long_texts_are_cut_with_a_marker_and_a_trajectory_is_bounded():
    long = traj(1, 0, 0.0, prompt=SEGMENT_CHARS * 3, turns=[(SEGMENT_CHARS, 1)] * 8)
    segs = segments(long, Letters().decode)
    prompt = segs[0]
    assert prompt["cut"] and f"[{SEGMENT_CHARS * 3 - SEGMENT_CHARS} characters cut]" in prompt["text"]
    assert prompt["text"].startswith("abc") and prompt["tokens"] == SEGMENT_CHARS * 3
    assert sum(len(s["text"]) for s in segs) < TRAJECTORY_CHARS + 100 * len(segs)
    assert segs[-1]["cut"] and segs[-1]["text"].strip().startswith("…")  # past the bound: the marker alone


def test_events_carry_the_advantage_and_whether_the_gradient_is_zero():
    trajs = [traj(0, 0, 1.0), traj(1, 0, 0.0), traj(2, 1, 0.5), traj(3, 1, 0.5)]
    events = trajectory_events(4, trajs, Letters(), AlgorithmConfig())
    assert [e["advantage"] != 0 for e in events] == [True, True, False, False]
    assert [e["zero_gradient"] for e in events] == [False, False, True, True]
    assert {e["step"] for e in events} == {4} and events[0]["turns"] == 2 and events[0]["tokens"] == 5
    with_kl = trajectory_events(4, trajs, Letters(), AlgorithmConfig(kl_coef=0.1))
    assert not any(e["zero_gradient"] for e in with_kl)  # the KL term has a gradient: a backward runs
