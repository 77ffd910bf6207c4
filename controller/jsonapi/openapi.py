"""OpenAPI 3 schema of the JSON API, written out by hand from the route table in urls.py.

tests/controller/test_api_openapi.py checks that every /api/ route is described here and
nothing else is, so the two cannot drift apart.
"""

import copy

from controller.comparisons.compare import MAX_COMPARED, MAX_LAUNCHED, MIN_COMPARED
from controller.comparisons.fairness import MIN_STEPS as MIN_COMPARED_STEPS
from controller.forms import DEFAULT_REPEATS, MAX_CONFIG_CHARS, MAX_CONFIG_VALUES, MAX_REPEATS, MAX_STEPS
from controller.limits.limits import INT32_MAX
from controller.models import Run, Schedule
from controller.overrides import MAX_OVERRIDES, MAX_SWEEP_VALUES
from controller.jsonapi.pagination import DEFAULT_PAGE, MAX_METRICS_PAGE, MAX_PAGE
from controller.limits.quotas import RESOURCE_LIMITS, quota_for

# Text fields: Django refuses NUL characters everywhere and, for required names, text that
# is empty once stripped of whitespace (Python's str.strip set, spelled out for ECMA regexes).
NO_NUL = "^[^\\u0000]*$"
_SPACE = "\\t\\n\\u000b\\u000c\\r\\u001c-\\u001f \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
NOT_BLANK = f"^[^\\u0000]*[^\\u0000{_SPACE}][^\\u0000]*$"


def text(max_length: int, required: bool = False) -> dict:
    if required:
        return {"type": "string", "minLength": 1, "maxLength": max_length, "pattern": NOT_BLANK}
    return {"type": "string", "maxLength": max_length, "pattern": NO_NUL}


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def json_body(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def int_path(name: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}


def int_query(name: str, description: str, minimum: int = -1, maximum: int = INT32_MAX) -> dict:
    schema = {"type": "integer", "minimum": minimum, "maximum": maximum}
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


ERRORS = {
    "400": json_body(ref("Errors"), "invalid input; one reason per field"),
    "401": json_body(ref("Errors"), "not logged in"),
    "403": json_body(ref("Errors"), "CSRF check failed (unsafe methods)"),
    "404": json_body(ref("Errors"), "no such object, or another user's"),
    "405": json_body(ref("Errors"), "method not allowed"),
}
STEP_RANGE = [
    int_query("step_from", "first step, inclusive"),
    int_query("step_to", "last step, inclusive"),
]

NULLABLE_INT = {"type": ["integer", "null"]}
OVERRIDES = {
    "description": (f"dotted config fields set for this launch (at most {MAX_OVERRIDES}), after the schedule's: "
                    "{\"train.lr\": 3e-4} or text with one field=value a line; validated like the config "
                    "(unknown field, type, range, rules across fields, quota: a 400 naming the field); "
                    "not train.schedule, train.steps or name"),
    "oneOf": [{"type": "object", "maxProperties": MAX_OVERRIDES,
               "propertyNames": {"pattern": "^[a-z_][a-z0-9_]*(\\.[a-z_][a-z0-9_]*)+$"},
               "additionalProperties": {"not": {"type": "object"}}},
              {"type": "string", "maxLength": 10_000}],
}
NULLABLE_NUMBER = {"type": ["number", "null"]}
SCHEMAS = {
    "Errors": {
        "type": "object",
        "properties": {"errors": {"type": "object", "additionalProperties": {"type": "string"}}},
        "required": ["errors"],
    },
    "ExperimentInput": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": text(200, required=True),
            "description": text(10_000),
            "config": {
                "description": (f"learner.config.RunConfig as a JSON object, or YAML text (<= {MAX_CONFIG_CHARS} "
                                f"chars, no anchors or aliases); at most {MAX_CONFIG_VALUES} values; validated by "
                                "learner.config (field types, ranges, rules across fields), then against the model roots and your quota "
                                "(docs/controller-api.md, Security and fair use)"),
                "oneOf": [{"type": "object"}, {"type": "string", "maxLength": MAX_CONFIG_CHARS}],
            },
        },
    },
    "Experiment": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "description": {"type": "string"},
            "config": {"type": "object"}, "created": {"type": "string", "format": "date-time"},
        },
    },
    "ScheduleInput": {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "kind"],
        "properties": {
            "name": text(100, required=True) | {"description": "unique among the global presets and yours"},
            "kind": {"type": "string", "enum": [k for k, _ in Schedule.KIND_CHOICES]},
            "knobs": {
                "type": "object",
                "description": ("config values; a bare key means train.<key>, e.g. {\"max_staleness\": 2}; "
                                "validated by learner.config"),
            },
        },
    },
    "Schedule": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"},
            "kind": {"type": "string", "enum": [k for k, _ in Schedule.KIND_CHOICES]},
            "knobs": {"type": "object"}, "global": {"type": "boolean"},
        },
    },
    "RunInput": {
        "type": "object",
        "additionalProperties": False,
        "required": ["experiment", "schedule"],
        "properties": {
            "experiment": {"type": "integer", "description": "one of your experiments"},
            "schedule": {"type": "integer", "description": "a global preset or one of yours"},
            "steps": {"type": "integer", "minimum": 1, "maximum": MAX_STEPS,
                      "description": "default: the experiment's train.steps; at most your steps quota"},
            "name": text(200),
            "overrides": OVERRIDES,
        },
    },
    "ComparisonInput": {
        "type": "object",
        "additionalProperties": False,
        "required": ["experiment", "schedules", "steps"],
        "properties": {
            "experiment": {"type": "integer", "minimum": 1, "maximum": INT32_MAX, "description": "one of your experiments"},
            "schedules": {"type": "array", "minItems": 1, "maxItems": MAX_LAUNCHED, "uniqueItems": True,
                          "items": {"type": "integer", "minimum": 1, "maximum": INT32_MAX},
                          "description": ("global presets or yours; at least two without a sweep; schedules x sweep "
                                          f"values x repeats at most {MAX_LAUNCHED} runs")},
            "steps": {"type": "integer", "minimum": MIN_COMPARED_STEPS, "maximum": MAX_STEPS,
                      "description": "the same for every run; at most your steps quota"},
            "name": text(200),
            "overrides": OVERRIDES,
            "repeats": {"type": "integer", "minimum": 1, "maximum": MAX_REPEATS, "default": DEFAULT_REPEATS,
                        "description": "runs per schedule (and sweep value), launched in alternating rounds and "
                                       "run one at a time; round k trains the launch's seed + k (its runs' "
                                       "seed override), and the summary pools them"},
            "sweep": {
                "type": "object", "additionalProperties": False, "required": ["field", "values"],
                "description": (f"one config field over 2-{MAX_SWEEP_VALUES} values: one run per value and schedule, "
                                f"times repeats at most {MAX_LAUNCHED} runs in all; each value validated like an override"),
                "properties": {
                    "field": {"type": "string", "maxLength": 200, "description": "a dotted config field, e.g. train.lr"},
                    "values": {"oneOf": [{"type": "array", "minItems": 2, "maxItems": MAX_SWEEP_VALUES,
                                          "items": {"not": {"type": "object"}}},
                                         {"type": "string", "maxLength": 1000,
                                          "description": "comma-separated"}]},
                },
            },
        },
    },
    "Comparison": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "experiment": {"type": "integer"},
            "steps": {"type": "integer"}, "url": {"type": "string", "description": "its compare page"},
            "repeats": {"type": "integer", "description": "runs per schedule (and sweep value)"},
            "sweep": {"type": ["object", "null"], "properties": {"field": {"type": "string"}, "values": {"type": "array"}}},
            "note": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
            "created": {"type": "string", "format": "date-time"},
            "runs": {"type": "array", "items": ref("Run")},
        },
    },
    "Run": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string"},
            "status": {"type": "string", "enum": list(Run.Status.values)},
            "schedule": {"type": "object", "properties": {
                "id": {"type": "integer"}, "name": {"type": "string"}, "kind": {"type": "string"}}},
            "experiment": {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"}}},
            "steps": {"type": "integer"},
            "created": {"type": "string", "format": "date-time"},
            "started": {"type": ["string", "null"], "format": "date-time"},
            "finished": {"type": ["string", "null"], "format": "date-time"},
            "error": {"type": "string", "description": "why a failed run failed (last stderr lines included)"},
            "summary": {"type": "object", "description": "the learner's summary, steps, mean/<metric>"},
            "cancel_requested": {"type": "boolean"},
            "last_seq": {"type": "integer", "description": "highest stored span seq, -1 before any"},
            "attempt": {"type": "integer", "description": "times the run was resumed from a checkpoint"},
            "checkpoints": {"type": "array", "items": {"type": "integer"},
                            "description": "steps after which the learner wrote a checkpoint"},
            "overrides": {"type": "object", "description": "config fields set at launch (a sweep's value included)"},
            "comparison": NULLABLE_INT | {"description": "the comparison or sweep it was launched in"},
        },
    },
    "Metric": {
        "type": "object",
        "properties": {"step": {"type": "integer"}, "values": {"type": "object",
                                                               "additionalProperties": {"type": ["number", "null"]}}},
    },
    "Span": {
        "type": "object",
        "properties": {
            "seq": {"type": "integer"}, "step": {"type": "integer"}, "kind": {"type": "string"},
            "t0": {"type": "number", "description": "seconds from run start"}, "t1": {"type": "number"},
            "lane": {"type": "string"}, "traj": NULLABLE_INT, "group": NULLABLE_INT, "turn": NULLABLE_INT,
            "policy_version": NULLABLE_INT, "tokens": {"type": "integer"},
        },
    },
    "Trajectory": {
        "type": "object",
        "description": "the learner's record of one trajectory after its step (docs/spans.md, Trajectory records)",
        "properties": {
            "step": {"type": "integer"}, "traj": {"type": "integer"}, "group": {"type": "integer"},
            "reward": {"type": "number"}, "advantage": {"type": ["number", "null"], "description": "GRPO's A_i"},
            "zero_gradient": {"type": "boolean", "description": "A = 0 and no KL/entropy term: no backward"},
            "turns": {"type": "integer"}, "tokens": {"type": "integer", "description": "generated tokens"},
            "drafted": {"type": "boolean"}, "error": {"type": "string"},
            "versions": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "TrajectoryText": {
        "allOf": [{"$ref": "#/components/schemas/Trajectory"}, {"type": "object", "properties": {"segments": {
            "type": "array", "description": "prompt, turns and observations in order; texts cut past ~4,000 characters",
            "items": {"type": "object", "properties": {
                "role": {"type": "string", "enum": ["prompt", "turn", "observation"]}, "text": {"type": "string"},
                "tokens": {"type": "integer"}, "cut": {"type": "boolean"}, "turn": {"type": "integer"},
                "version": NULLABLE_INT, "tool_call": {"type": "boolean"}}}}}}],
    },
    "Advice": {
        "type": "object",
        "description": "the schedule advisor (null: see advisor_note) and streaming's drain decisions (null: no "
                       "drain metrics); docs/pages-run.md, Schedule advisor",
        "properties": {
            "advisor": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
                "run": {"type": "integer"}, "schedule": {"type": "string", "description": "the run's own schedule"},
                "steps_replayed": {"type": "integer"}, "first_step": {"type": "integer"},
                "rollout_slots": {"type": "integer"}, "learner_ranks": {"type": "integer"},
                "rollout_s": {"type": "number", "description": "R: a batch's rollout makespan alone (median)"},
                "learner_s": {"type": "number", "description": "L: its learner work alone, barrier included"},
                "rl_ratio": {"type": "number"},
                "regime": {"type": "string", "enum": ["rollout-bound", "balanced", "learner-bound"]},
                "breakdown": {"type": "object", "description": "where a sync step goes", "properties": {
                    "rollout_s": {"type": "number"}, "backward_s": {"type": "number"}, "barrier_s": {"type": "number"}}},
                "schedules": {"type": "array", "items": {"type": "object", "properties": {
                    "schedule": {"type": "string"}, "step_s": {"type": "number"}, "speedup_vs_sync": {"type": "number"},
                    "learner_idle": {"type": "number"}, "rollout_idle": {"type": "number"},
                    "staleness_mean": {"type": "number"}, "staleness_max": {"type": "integer"},
                    "tail_s": {"type": "number"}}}},
                "measured_step_s": NULLABLE_NUMBER | {"description": "the run's median timing_s/step over the replayed steps"},
                "simulated_step_s": NULLABLE_NUMBER | {"description": "the simulated step of the run's own schedule"},
                "model_error": NULLABLE_NUMBER | {"description": "(simulated - measured) / measured"},
                "advice": {"type": "string", "description": "the one sentence"}}}]},
            "advisor_note": {"type": "string", "description": "why there is no advice (empty: there is)"},
            "drain": {"oneOf": [{"type": "null"}, {"type": "object", "properties": {
                "steps": {"type": "integer"}, "deferred_steps": {"type": "array", "items": {"type": "integer"}},
                "headline": {"type": "string"}, "more": {"type": "integer"},
                "notes": {"type": "array", "items": {"type": "object", "properties": {
                    "step": {"type": "integer"}, "deferred": {"type": "boolean"}, "sentence": {"type": "string"},
                    "early_row_share": NULLABLE_NUMBER, "late_close_share": NULLABLE_NUMBER,
                    "early_cost_ratio": NULLABLE_NUMBER, "reason": {"type": ["string", "null"]}}}}}}]},
        },
    },
    "CompareRun": {
        "type": "object",
        "description": "one run's figures; null where the stored metrics do not give it",
        "properties": {
            "id": {"type": "integer"}, "name": {"type": "string"}, "status": {"type": "string"},
            "schedule": {"type": "string"},
            "steps_done": {"type": "integer", "description": "steps with stored metrics"},
            "step_s": NULLABLE_NUMBER | {"description": "median timing_s/step"},
            "step_p10_s": NULLABLE_NUMBER | {"description": "10th percentile of timing_s/step"},
            "step_p90_s": NULLABLE_NUMBER | {"description": "90th percentile of timing_s/step"},
            "speedup_p10": NULLABLE_NUMBER | {"description": "the sync run's step_s / this step_p90_s"},
            "speedup_p90": NULLABLE_NUMBER | {"description": "the sync run's step_s / this step_p10_s"},
            "speedup_vs_sync": NULLABLE_NUMBER | {"description": "the sync run's step_s / this step_s"},
            "efficiency": NULLABLE_NUMBER | {"description": "bound_s / step_mean_s, at most 1 (docs/bench-report.md, Efficiency); "
                                                           "null for a run without stored spans of work"},
            "bound_s": NULLABLE_NUMBER | {"description": "the least step this run's own work allows under its "
                                                        "schedule's rule (bound_rule)"},
            "bound_rule": {"type": ["string", "null"], "enum": ["serial", "barrier", "overlapped", None],
                           "description": "serial (sync): engine + learner work; barrier (streaming): max(engine + "
                                          "optimizer and publish, learner); overlapped (async, fully-async, "
                                          "speculation): max(engine, learner)"},
            "bound_barrier_s": NULLABLE_NUMBER | {"description": "per step: the optimizer and publish spans"},
            "barrier_s": NULLABLE_NUMBER | {"description": "per step: union of the optimizer and publish spans per "
                                                          "rank, averaged over ranks"},
            "engine_busy_s": NULLABLE_NUMBER | {"description": "per step: union of the engine's rollout spans but "
                                                              "the modelled tool wait, per worker, averaged over workers"},
            "learner_work_s": NULLABLE_NUMBER | {"description": "per step: union of the learner spans per rank, "
                                                               "averaged over ranks"},
            "step_mean_s": NULLABLE_NUMBER | {"description": "training window length / steps"},
            "learner_idle": NULLABLE_NUMBER | {"description": "share of the training window with no learner span"},
            "rollout_idle": NULLABLE_NUMBER | {"description": "share of the training window with no rollout span"},
            "training_s": NULLABLE_NUMBER | {"description": "first step start to last step end"},
            "staleness_mean": NULLABLE_NUMBER, "staleness_max": NULLABLE_NUMBER,
            "tail_s": NULLABLE_NUMBER | {"description": "median timing_s/tail (last reward to step end)"},
            "final_reward": NULLABLE_NUMBER,
            "time_to_reward_s": NULLABLE_NUMBER | {"description": "first step start to the end of the first step "
                                                                  "whose smoothed reward/mean >= reward_level"},
            "reward_step": NULLABLE_INT,
            "reward_level": NULLABLE_NUMBER | {"description": "the level this run is timed to (null: none it crosses)"},
            "reward_improved": {"type": ["boolean", "null"], "description": "its smoothed reward/mean rose above its "
                                                                           "first step's later (null: no reward yet)"},
            "reward_at_first_step": {"type": "boolean", "description": "it was at the level at its first step"},
            "kept_token_share": NULLABLE_NUMBER | {"description": "mean speculation/kept_token_share (null: no drafts)"},
            "whole_draft_share": NULLABLE_NUMBER | {"description": "mean speculation/whole_draft_share"},
            "drafted_tokens": NULLABLE_NUMBER | {"description": "total speculation/drafted_tokens"},
        },
    },
    "Compare": {
        "type": "object",
        "properties": {
            "reference": NULLABLE_INT | {"description": "id of the sync run (1.00x), null without one"},
            "rollout_s": NULLABLE_NUMBER | {"description": "R: the sync run's median last reward - step start"},
            "learner_s": NULLABLE_NUMBER | {"description": "L: the sync run's median step end - first backward"},
            "reward_level": NULLABLE_NUMBER | {"description": "the one level every run is timed to (typed, or from the "
                                                             "curves); null with several or none"},
            "reward_levels": {"type": "array", "items": {"type": "number"},
                              "description": "levels from the runs' own curves: each run that improved crosses one "
                                             "after its first step (empty: no run improved)"},
            "reward_smoothing": {"type": "number", "description": "EMA weight applied to reward/mean"},
            "warnings": {"type": "array", "items": {"type": "string"},
                         "description": "what makes a ratio between these runs unfair (empty: nothing)"},
            "runs": {"type": "array", "items": ref("CompareRun")},
            "reward_level_note": {"type": "string", "description": "the time to reward's plain sentence: several levels, "
                                                                   "runs that never improved, no run improved, or a typed "
                                                                   "level every run had at its first step (empty: none)"},
            "pooled": {"type": "array", "description": "per schedule preset and overrides: its runs' steps pooled "
                                                        "(controller/comparisons/pooled.py)", "items": {"type": "object", "properties": {
                "label": {"type": "string"}, "schedule": {"type": "string"},
                "runs": {"type": "array", "items": {"type": "integer"}}, "steps": {"type": "integer"},
                "step_s": NULLABLE_NUMBER | {"description": "median step over the pooled steps"},
                "step_ci90": {"type": ["array", "null"], "items": {"type": "number"}, "description": "bootstrap 90%"},
                "speedup_vs_sync": NULLABLE_NUMBER, "speedup_ci90": {"type": ["array", "null"], "items": {"type": "number"}},
                "speedup_spans_one": {"type": "boolean", "description": "the speedup's interval admits 1"},
                "reward_mean": NULLABLE_NUMBER, "response_length_vs_sync": NULLABLE_NUMBER,
                "response_length_vs_sync_ci90": {"type": ["array", "null"], "items": {"type": "number"}},
                "step_equal_work_s": NULLABLE_NUMBER | {"description": "the windows per batch they produced "
                                                                         "(docs/bench-report.md, equal-work windows)"},
                "slowest_decile_tokens": {"type": ["integer", "null"], "description": "sync's 90th percentile of "
                                                                                      "generated tokens per trajectory"},
                "slowest_decile_share": NULLABLE_NUMBER | {"description": "share of trained trajectories at or "
                                                                            "above slowest_decile_tokens"},
                "trained_warning": {"type": ["string", "null"]}}}},
            "trained_warnings": {"type": "array", "items": {"type": "string"},
                                 "description": "schedules that trained other trajectories than sync's (learner/bench/trained.py)"},
        },
    },
}


def operation(summary: str, ok: dict, parameters=(), body: dict | None = None, ok_status: str = "200",
              more_responses: dict | None = None) -> dict:
    responses = {ok_status: ok, **ERRORS, **(more_responses or {})}
    op = {"summary": summary, "parameters": list(parameters), "responses": responses}
    if body is not None:
        responses["413"] = json_body(ref("Errors"), "request body too large")
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": body}}}
    return op


def list_of(key: str, item: str) -> dict:
    return {"type": "object", "properties": {key: {"type": "array", "items": ref(item)}}}


def page_of(key: str, item: str) -> dict:
    """A page of a list (controller/jsonapi/pagination.py): the items, the total and the neighbours' links."""
    link = {"type": ["string", "null"], "description": "path and query of that page; null at the end"}
    return {"type": "object", "required": [key, "count", "limit", "offset", "next", "previous"], "properties": {
        key: {"type": "array", "items": ref(item)},
        "count": {"type": "integer", "minimum": 0, "description": "items the filters keep, on every page"},
        "limit": {"type": "integer", "minimum": 1}, "offset": {"type": "integer", "minimum": 0},
        "next": link, "previous": link}}


def page_params(default: int = DEFAULT_PAGE, maximum: int = MAX_PAGE) -> list[dict]:
    return [int_query("limit", f"page size (default {default}, at most {maximum})", minimum=1, maximum=maximum),
            int_query("offset", "items skipped before the page (default 0)", minimum=0)]


STORED_FULL = {"409": json_body(ref("Errors"), "you keep as many as the per-user limit allows (the message names it)")}


RUN_ID = int_path("run_id")
REWARD_LEVEL = {"name": "reward", "in": "query", "required": False, "schema": {"type": "number"},
                "description": "smoothed reward/mean level for time_to_reward_s (default: levels from the runs' own curves, "
                               "docs/pages-compare.md)"}
SMOOTHING = {"name": "smoothing", "in": "query", "required": False,
             "schema": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
             "description": "EMA weight of reward/mean for time_to_reward_s (default 0.8; 0: raw)"}
PATHS = {
    "/api/openapi.json": {"get": operation("This schema", json_body({"type": "object"}, "OpenAPI 3.1 document"))},
    "/api/experiments/": {
        "get": operation("Your experiments, newest first, a page at a time",
                         json_body(page_of("experiments", "Experiment"), "experiments"), page_params()),
        "post": operation("Create an experiment (config validated by learner.config)",
                          json_body(ref("Experiment"), "created"), body=ref("ExperimentInput"), ok_status="201",
                          more_responses=STORED_FULL),
    },
    "/api/experiments/{experiment_id}/": {
        "get": operation(f"One experiment with its newest {DEFAULT_PAGE} runs (all of them: runs_url)",
                         json_body({"allOf": [ref("Experiment"), list_of("runs", "Run"), {"type": "object", "properties": {
                             "runs_count": {"type": "integer", "minimum": 0, "description": "all its runs"},
                             "runs_url": {"type": "string", "description": "/api/runs/?experiment=<id>, paged"}}}]},
                                   "experiment"),
                         [int_path("experiment_id")]),
    },
    "/api/schedules/": {
        "get": operation("Global presets and yours, by name, a page at a time",
                         json_body(page_of("schedules", "Schedule"), "schedules"), page_params()),
        "post": operation("Create a schedule preset", json_body(ref("Schedule"), "created"),
                          body=ref("ScheduleInput"), ok_status="201"),
    },
    "/api/runs/": {
        "get": operation("Your runs, newest first, a page at a time", json_body(page_of("runs", "Run"), "runs"),
                         [int_query("experiment", "only this experiment's runs", minimum=1), *page_params()]),
        "post": operation("Create a run and launch it on the runs queue", json_body(ref("Run"), "queued"),
                          body=ref("RunInput"), ok_status="201", more_responses={
                              "429": json_body(ref("Errors"), "your queued-runs quota is full"), **STORED_FULL}),
    },
    "/api/comparisons/": {
        "get": operation("Your comparisons and sweeps, newest first, a page at a time",
                         json_body(page_of("comparisons", "Comparison"), "comparisons"),
                         [int_query("experiment", "only this experiment's comparisons", minimum=1), *page_params()]),
        "post": operation(f"Launch a comparison (schedules x repeats) or a small sweep (one field x values x schedules x "
                          f"repeats), at most {MAX_LAUNCHED} runs, as one comparison: every run queued, or none "
                          "(config or quota refusal)",
                          json_body(ref("Comparison"), "queued"), body=ref("ComparisonInput"), ok_status="201",
                          more_responses={"429": json_body(ref("Errors"), "your queued-runs quota cannot take them all"),
                                          **STORED_FULL}),
    },
    "/api/comparisons/{comparison_id}/": {
        "get": operation("One comparison with every run it launched and their compare summary, repeats pooled per "
                         "schedule (null once no run is left)",
                         json_body({"allOf": [ref("Comparison"), {"type": "object", "properties": {
                             "summary": {"oneOf": [ref("Compare"), {"type": "null"}]}}}]}, "comparison"),
                         [int_path("comparison_id"), REWARD_LEVEL, SMOOTHING]),
    },
    "/api/runs/{run_id}/": {"get": operation("One run", json_body(ref("Run"), "run"), [RUN_ID])},
    "/api/runs/{run_id}/cancel/": {
        "post": operation("Cancel: SIGTERM, then SIGKILL after a grace period; ends 'cancelled'",
                          json_body(ref("Run"), "cancel requested"), [RUN_ID], ok_status="202",
                          more_responses={"409": json_body(ref("Errors"), "the run has already finished")}),
    },
    "/api/runs/{run_id}/resume/": {
        "post": operation("Resume a failed or cancelled run from its latest checkpoint (a new attempt)",
                          json_body(ref("Run"), "queued again"), [RUN_ID], ok_status="202",
                          more_responses={"409": json_body(ref("Errors"), "not failed/cancelled, or no checkpoint")}),
    },
    "/api/runs/{run_id}/metrics/": {
        "get": operation("Per-step metrics in step order, a page at a time",
                         json_body(page_of("metrics", "Metric"), "metrics"),
                         [RUN_ID, *page_params(MAX_METRICS_PAGE, MAX_METRICS_PAGE)]),
    },
    "/api/runs/{run_id}/advice/": {
        "get": operation("The schedule advisor (the simulator on a finished run's own spans: each schedule's step, "
                         "idle and staleness, R/L, the model's error on this run) and streaming's drain decisions",
                         json_body(ref("Advice"), "advice"), [RUN_ID]),
    },
    "/api/runs/{run_id}/spans/": {
        "get": operation(
            "Spans in seq order; last_seq is the cursor for the next page",
            json_body({"type": "object", "properties": {"spans": {"type": "array", "items": ref("Span")},
                                                        "last_seq": {"type": "integer"},
                                                        "next": {"type": ["string", "null"], "description": (
                                                            "the next page (after=last_seq) when this one is full, "
                                                            "else null")}}}, "spans"),
            [RUN_ID, int_query("after", "only spans with seq > after (default -1)"), *STEP_RANGE,
             int_query("limit", "page size (default 2000)", minimum=1, maximum=10_000)],
        ),
    },
    "/api/runs/{run_id}/trajectories/": {
        "get": operation("A step's trajectory records, without their text",
                         json_body({"type": "object", "properties": {
                             "step": {"type": "integer"},
                             "trajectories": {"type": "array", "items": ref("Trajectory")}}}, "trajectories"),
                         [RUN_ID, {**int_query("step", "the step (required)", minimum=0), "required": True}]),
    },
    "/api/runs/{run_id}/trajectories/{traj}/": {
        "get": operation("One trajectory with its decoded text (404 while the learner has not recorded it)",
                         json_body(ref("TrajectoryText"), "trajectory"),
                         [RUN_ID, {"name": "traj", "in": "path", "required": True,
                                   "schema": {"type": "integer", "minimum": 0, "maximum": INT32_MAX}}]),
    },
    "/api/runs/{run_id}/trace.json": {
        "get": operation("Chrome Trace Event JSON (opens in Perfetto)",
                         json_body({"type": "object", "properties": {"traceEvents": {"type": "array"}}}, "trace"),
                         [RUN_ID, *STEP_RANGE]),
    },
    "/api/runs/{run_id}/metrics.csv": {
        "get": operation("Per-step metrics as CSV (step, then one column per metric)",
                         {"description": "CSV", "content": {"text/csv": {"schema": {"type": "string"}}}}, [RUN_ID]),
    },
    "/api/compare/": {
        "get": operation(
            f"Summary of {MIN_COMPARED}-{MAX_COMPARED} hand-picked runs of yours (docs/pages-compare.md, Compare summary; a "
            "comparison's whole summary: /api/comparisons/{id}/)", json_body(ref("Compare"), "summary"),
            [{"name": "runs", "in": "query", "required": True, "style": "form", "explode": False,
              "description": f"comma-separated run ids ({MIN_COMPARED}-{MAX_COMPARED}, distinct)",
              "schema": {"type": "array", "minItems": MIN_COMPARED, "maxItems": MAX_COMPARED, "uniqueItems": True,
                         "items": {"type": "integer", "minimum": 1, "maximum": INT32_MAX}}},
             REWARD_LEVEL, SMOOTHING],
        ),
    },
}


def quota_bounds(quota) -> dict:
    """The config fields the user's quota bounds, as JSON Schema maxima (YAML text is checked
    against the same bounds once parsed)."""
    sections: dict[str, dict] = {}
    for path, limit in {**RESOURCE_LIMITS, "train.steps": "steps"}.items():
        section, name = path.split(".")
        sections.setdefault(section, {"type": "object", "properties": {}})["properties"][name] = {
            "type": "integer", "minimum": 1, "maximum": getattr(quota, limit), "description": f"your {limit} quota"}
    return sections


def schema(user) -> dict:
    """The schema as ``user`` is served it: limits from their quota included."""
    schemas = copy.deepcopy(SCHEMAS)
    quota = quota_for(user)
    for name in ("RunInput", "ComparisonInput"):  # the server refuses past the quota (quotas.check_config)
        steps = schemas[name]["properties"]["steps"]
        steps["maximum"] = min(MAX_STEPS, quota.steps)
    schemas["ExperimentInput"]["properties"]["config"]["oneOf"][0]["properties"] = quota_bounds(quota)
    return {
        "openapi": "3.1.0",
        "info": {"title": "ThunderSync Lab controller API", "version": "1"},
        "components": {
            "schemas": schemas,
            "securitySchemes": {"session": {"type": "apiKey", "in": "cookie", "name": "sessionid"}},
        },
        "security": [{"session": []}],
        "paths": PATHS,
    }
