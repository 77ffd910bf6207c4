"""Built-in tokenizer and models: cache mechanics on a fast recipe in a tmp cache; the
calibrated policy and teacher from the shared cache (built once, ~20 s + ~45 s of CPU)."""

from __future__ import annotations

import multiprocessing
import random

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from learner.config import TaskConfig
from learner.models import loading as models
from learner.tasks.env import ArithToolEnv, Environment, Task, canonical_turns, evaluate
from learner.models.loading import generate_turns, load_model, load_tokenizer, resolve_model_dir, stop_token_ids
from learner.models.warm_start import BuildRecipe, sft_batch, sft_warm_start
from learner.tasks.char_tokenizer import AGENT_TAGS, build_char_tokenizer

FAST_RECIPE = BuildRecipe(hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, sft_steps=3, batch_size=4)


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def fast_tiny(monkeypatch):
    """'builtin:tiny' built from a 3-step recipe, so cache tests take a second, not 20."""
    monkeypatch.setitem(models.BUILTIN_RECIPES, "tiny", FAST_RECIPE)


@pytest.fixture(scope="session")
def shared_builtins():
    return {name: resolve_model_dir(f"builtin:{name}") for name in ("tiny", "teacher")}


def test_tokenizer_maps_every_tag_and_character_to_one_id():
    tok = build_char_tokenizer()
    for tag in AGENT_TAGS + ("<bos>", "<eos>", "<pad>"):
        assert len(tok.encode(tag, add_special_tokens=False)) == 1, tag
    text = "<bos>Q:12+3*4=?\n<call>3*4</call><obs>12</obs><ans>24</ans><eos>"
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) == 26
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok.decode(ids) == text


def test_tokenizer_saves_and_reloads_with_its_special_tokens(tmp_path):
    build_char_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<bos>", "<eos>", "<pad>")
    assert tok.decode(tok.encode("Q: 7-2*3=?\n", add_special_tokens=False)) == "Q: 7-2*3=?\n"
    assert tok.encode("ab", add_special_tokens=True) == tok.encode("ab", add_special_tokens=False)


def _assistant_positions(tokens: list[str]) -> list[int]:
    """1 from each <call> through its </call> and from <ans> through <eos>; 0 elsewhere."""
    inside, marks = False, []
    for tok in tokens:
        inside = inside or tok in ("<call>", "<ans>")
        marks.append(int(inside))
        if tok in ("</call>", "<eos>"):
            inside = False
    return marks


def test_sft_batch_scores_exactly_the_assistant_turns_of_canonical_traces():
    tok = build_char_tokenizer()
    input_ids, attention, labels = sft_batch(tok, ArithToolEnv(TaskConfig()), random.Random(3), batch_size=16)
    assert input_ids.shape == attention.shape == labels.shape and input_ids.shape[0] == 16
    for ids, att, lab in zip(input_ids.tolist(), attention.tolist(), labels.tolist()):
        length = sum(att)
        assert att == [1] * length + [0] * (len(ids) - length)  # right padding
        tokens = tok.convert_ids_to_tokens(ids[:length])
        scored = [int(label != -100) for label in lab[:length]]
        assert scored == _assistant_positions(tokens)
        assert all(label == i for label, i in zip(lab, ids) if label != -100)
        assert all(label == -100 for label in lab[length:])
        text = tok.decode(ids[:length])
        expression = text.removeprefix("<bos>Q:").split("=?")[0]
        answer_turn, _ = canonical_turns(Task("", evaluate(expression), expression))[-1]
        assert text.endswith(answer_turn)


def test_sft_warm_start_learns_the_format():
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    recipe = BuildRecipe(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, sft_steps=40, batch_size=8)
    model = LlamaForCausalLM(models._llama_config(recipe, tok))
    losses = sft_warm_start(model, tok, TaskConfig(), recipe, seed=0)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.6 * losses[0]
    assert not model.training


def test_builtin_is_built_once_then_served_from_cache(tmp_path, fast_tiny, monkeypatch):
    builds = []
    real_build = models.build_builtin
    monkeypatch.setattr(models, "build_builtin", lambda *a: builds.append(a) or real_build(*a))
    first = resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path), seed=0)
    again = resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path), seed=0)
    assert first == again and len(builds) == 1
    assert first.parent == tmp_path / "models" and first.name.startswith("tiny-")
    assert {p.name for p in first.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()] == [first.name]  # no temp dir left


def test_builtin_weights_are_a_function_of_the_seed(tmp_path, fast_tiny):
    a = resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path / "a"), seed=0)
    b = resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path / "b"), seed=0)
    c = resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path / "a"), seed=1)
    assert a.name == b.name != c.name
    wa, wb, wc = (load_model(p).state_dict() for p in (a, b, c))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.equal(wa["model.embed_tokens.weight"], wc["model.embed_tokens.weight"])


def _resolve_in_child(cache_dir: str, queue) -> None:
    queue.put(str(resolve_model_dir("builtin:tiny", cache_dir=cache_dir, seed=0)))


def test_concurrent_processes_build_once_and_agree(tmp_path, fast_tiny, monkeypatch):
    marker = tmp_path / "builds.log"
    real_build = models.build_builtin

    def counted_build(name, out_dir, seed):
        with open(marker, "a") as log:
            log.write(f"{out_dir}\n")
        real_build(name, out_dir, seed)

    monkeypatch.setattr(models, "build_builtin", counted_build)
    ctx = multiprocessing.get_context("fork")  # children inherit the fast recipe and the counter
    queue = ctx.Queue()
    workers = [ctx.Process(target=_resolve_in_child, args=(str(tmp_path), queue)) for _ in range(3)]
    for w in workers:
        w.start()
    paths = {queue.get(timeout=60) for _ in workers}
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert len(paths) == 1
    assert len(marker.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("spec", "reason"),
    [("builtin:huge", "unknown built-in model"), ("/nonexistent/model", "existing directory")],
)
def test_resolve_rejects_bad_specs_naming_them(spec, reason):
    with pytest.raises(ValueError, match=f"model spec '{spec}': .*{reason}"):
        resolve_model_dir(spec)


def test_resolve_rejects_a_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no config.json and weights"):
        resolve_model_dir(str(tmp_path))


def test_any_local_hf_directory_loads_the_same_way(tmp_path):
    tok = build_char_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert resolve_model_dir(str(tmp_path)) == tmp_path
    model = load_model(tmp_path, dtype=torch.float64)
    assert not model.training and model.dtype == torch.float64
    assert load_tokenizer(tmp_path).pad_token_id == tok.pad_token_id


def test_builtin_policy_loads_in_eval_mode_and_stops_at_turn_ends(shared_builtins):
    path = shared_builtins["tiny"]
    model, tok = load_model(path), load_tokenizer(path)
    assert type(model).__name__ == "LlamaForCausalLM" and not model.training
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 3
    assert list(model.generation_config.eos_token_id) == stop_token_ids(tok)
    env = ArithToolEnv(TaskConfig())
    tasks = [env.sample_task(random.Random(i)) for i in range(16)]
    contexts = [tok.encode(t.prompt_text, add_special_tokens=False) for t in tasks]
    torch.manual_seed(0)
    turns = generate_turns(model, tok, contexts, temperature=0.0, max_new_tokens=24)
    assert all(turn[-1] in stop_token_ids(tok) for turn in turns)
    # the warm start mixes tool calls and direct answers (warm_start.BuildRecipe): both well formed
    kinds = [env.parse_turn(t, tok.decode(turn)).kind for t, turn in zip(tasks, turns)]
    assert set(kinds) <= {"tool", "final"} and "tool" in kinds, kinds


def sft_success_rate(
    model,
    tokenizer,
    env: Environment,
    n: int,
    rng: random.Random,
    temperature: float = 1.0,
    max_new_tokens: int = 24,
) -> float:
    """Mean reward of ``n`` episodes run with the env's tools (episode rules: env.py)."""
    torch.manual_seed(rng.randrange(2**31))
    tasks = [env.sample_task(rng) for _ in range(n)]
    contexts = [tokenizer.encode(t.prompt_text, add_special_tokens=False) for t in tasks]
    rewards = [0.0] * n
    active = list(range(n))
    for _turn in range(max(t.max_turns for t in tasks)):
        active = [i for i in active if _turn < tasks[i].max_turns]
        if not active:
            break
        turns = generate_turns(model, tokenizer, [contexts[i] for i in active], temperature, max_new_tokens)
        still_running = []
        for i, turn_ids in zip(active, turns):
            text = tokenizer.decode(turn_ids)
            result = env.parse_turn(tasks[i], text)
            if result.kind == "tool":
                observation = env.observation_text(env.run_tool(result.payload))
                contexts[i] += turn_ids + tokenizer.encode(observation, add_special_tokens=False)
                still_running.append(i)
            elif result.kind == "final":
                rewards[i] = env.reward(tasks[i], text)
        active = still_running
    return sum(rewards) / n


def test_policy_starts_nonzero_but_imperfect_and_teacher_is_clearly_stronger(shared_builtins):
    env = ArithToolEnv(TaskConfig())
    rates = {}
    for name, path in shared_builtins.items():
        rates[name] = sft_success_rate(load_model(path), load_tokenizer(path), env, 300, random.Random(1), 1.0)
    assert 0.15 <= rates["tiny"] <= 0.6, rates
    assert rates["teacher"] >= 0.7 and rates["teacher"] >= rates["tiny"] + 0.3, rates


# ------------------------------------------------------------------ shipped weights


def test_the_shipped_weights_match_their_manifest_and_are_what_the_seed_0_build_serves(tmp_path):
    """Seed 0's built-ins are the shipped files, byte for byte, on every machine; a tiny recipe
    trained here would differ in the last bits from one processor's kernels to another's."""
    for name in ("tiny", "teacher"):
        weights = models.shipped_weights(name, seed=0)
        assert weights is not None and weights.parent == models.SHIPPED_DIR
        built = resolve_model_dir(f"builtin:{name}", cache_dir=str(tmp_path), seed=0)
        assert (built / "model.safetensors").read_bytes() == weights.read_bytes()
        model = load_model(built)  # a complete HF directory: config, weights, tokenizer
        assert model.config.hidden_size == models.BUILTIN_RECIPES[name].hidden_size
        assert load_tokenizer(built).pad_token == "<pad>"


def test_another_seed_or_recipe_is_trained_not_copied(fast_tiny):
    assert models.shipped_weights("tiny", seed=0) is None  # the fast recipe is not the shipped one
    assert models.shipped_weights("teacher", seed=1) is None  # the shipped recipe, another seed


def test_damaged_shipped_weights_are_an_error_naming_the_file(tmp_path, monkeypatch):
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    for f in models.SHIPPED_DIR.iterdir():
        (shipped / f.name).write_bytes(f.read_bytes())
    data = bytearray((shipped / "tiny.safetensors").read_bytes())
    data[-256:] = bytes(256)  # same size, other bytes
    (shipped / "tiny.safetensors").write_bytes(bytes(data))
    monkeypatch.setattr(models, "SHIPPED_DIR", shipped)
    with pytest.raises(ValueError, match=r"builtin:tiny.*tiny\.safetensors have sha256 .*reinstall"):
        resolve_model_dir("builtin:tiny", cache_dir=str(tmp_path / "cache"), seed=0)
    assert not list((tmp_path / "cache" / "models").glob("tiny-*"))  # nothing half-built left in the cache


def test_the_run_seed_does_not_change_the_builtin_model():
    from learner.config import RunConfig

    a = RunConfig.model_validate({"seed": 3})
    assert a.model.builtin_seed == 0  # seed 3's run samples differently, from the same shipped model
