"""scripts/replay.py and scripts/predict_gpu.py: acceptance recorded along the target's path, replayed
against a device's cost curve; scripts/predict_from_bench.py: a bench run's draft steps priced by one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localspec.config import DrafterKind, Speculation
from localspec.engine.drafters.spec import draft_limit

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import predict_from_bench  # noqa: E402
import predict_gpu  # noqa: E402
from replay import RecordedDraftModel, chain_lengths, replay  # noqa: E402

EXAMPLE_DEVICE = ROOT / "docs" / "examples" / "example-device-report.json"
SHAPE = predict_gpu.QWEN_SHAPE
FLAT = {1: 1.0, 64: 1.0}  # verifying any batch costs what one token does
LINEAR = {1: 1.0, 64: 64.0}  # verifying k tokens costs k single ones


def device(ratios: dict[int, float], token_cost: float | None) -> dict:
    section = {"verify": {"seconds_1": 0.004, "ratios": {str(n): r for n, r in ratios.items()}}}
    if token_cost is not None:
        section["draft_cost"] = {"token_cost": token_cost}
    return {"device": "a test device", "date": "today", "targets": {SHAPE: section}}


def recording(reply_length: int = 120, agrees: bool = True, sure: float = 1.0) -> dict:
    """One prompt and a reply of tokens seen nowhere before (so n-gram lookup and the suffix cache find
    nothing), the draft model's likeliest token right everywhere or nowhere."""
    prompt = list(range(1000, 1020))
    reply = list(range(2000, 2000 + reply_length))
    likeliest = reply if agrees else [7] * reply_length
    item = {"prompt": prompt, "reply": reply, "draft": {"likeliest": likeliest, "sure": [sure] * reply_length}}
    return {"target": "t", "draft": "d", "max_tokens": reply_length, "sets": {"made-up": [item]}}


def test_a_draft_is_accepted_as_far_as_its_tokens_agree_with_the_reply_without_a_break():
    reply = [5, 6, 7, 8, 9, 9]
    assert chain_lengths([5, 6, 7, 0, 9, 9], reply) == [3, 2, 1, 0, 2, 1]
    assert chain_lengths([0] * 6, reply) == [0] * 6
    # position 1 is tried from every start, position 2 where position 1 was accepted and the reply has room
    # for two tokens (the last start has not): accepted from 3 of the 4 starts 0, 1, 2, 4
    runs = [chain_lengths([5, 6, 7, 0, 9, 9], reply)]
    first, second = predict_gpu.acceptance_by_position(runs, 2)
    assert first == pytest.approx(5 / 6) and second == pytest.approx(3 / 4)


def test_a_change_of_batch_size_is_charged_as_auto_calibrated_it_in_whichever_stage_measured_it():
    section = device(FLAT, 0.1)["targets"][SHAPE]
    assert predict_gpu.changing_of(section) == (0.0, 0.0)  # nothing measured it: none
    section["policy"] = {"reshape": 0.76, "recapture": 0.89, "modes": {}}  # stage (h) alone (the fifth lease)
    assert predict_gpu.changing_of(section) == (0.76, 0.89)
    section["auto_costs"] = {"reshape": 0.5, "recapture": 0.6}  # stage (f)'s, after a generation, come first
    assert predict_gpu.changing_of(section) == (0.5, 0.6)


def test_the_draft_model_stops_where_it_is_unsure_along_the_path_and_past_a_miss_is_taken_as_sure():
    costs = predict_gpu.device_costs(device(FLAT, 0.1), SHAPE, "test")
    model = RecordedDraftModel(costs, p_min=0.6)
    prompt, reply = [1, 2, 3], [10, 11, 12, 13, 14, 15]
    model.follow({"prompt": prompt, "reply": reply,
                  "draft": {"likeliest": [10, 11, 99, 13, 14, 15], "sure": [0.9, 0.9, 0.9, 0.1, 0.1, 0.9]}})
    model.begin(prompt, None, None)
    assert model.propose(prompt, 2).tokens == [10, 11]
    # the miss at the third position is drafted (sure there); unsure after it, the draft model is not known
    assert model.propose(prompt, 5).tokens == [10, 11, 99, 13, 14]
    assert model.propose(prompt + [10, 11, 12], 3).tokens == []  # on the path and unsure: it stops


def test_a_sure_draft_that_is_always_right_is_charged_its_tokens_and_a_catch_up_of_the_token_it_did_not_read():
    costs = predict_gpu.device_costs(device(FLAT, 0.1), SHAPE, "test")
    item = recording()["sets"]["made-up"][0]
    model = RecordedDraftModel(costs, p_min=0.6)
    model.follow(item)
    seconds, steps = replay(model, item["prompt"], item["reply"], costs, 3)
    assert [(step.drafted, step.accepted) for step in steps] == [(3, 3)] * 30
    # 3 decodes a step (the first reads the token committed last) and one verification; every step but the
    # first also reads the last drafted token, which a draft of 3 never fed
    catch_up = 0.1 * 1.0 / predict_gpu.CATCH_UP_BATCH
    assert seconds == pytest.approx(0.004 * (30 * (3 * 0.1 + 1.0) + 29 * catch_up))


def test_an_unsure_draft_model_costs_a_decode_a_step_and_drafts_nothing():
    sets = predict_gpu.predict(recording(sure=0.5), device(FLAT, 0.1), SHAPE, "test")
    # (the step of the reply's last token has no room for a draft, and asks none)
    assert sets["made-up"]["speedups"][DrafterKind.DRAFT] == pytest.approx(120 / (119 * 1.1 + 1))
    assert sets["made-up"]["drafting"][DrafterKind.DRAFT] == {}


def test_where_verification_is_nearly_free_a_right_draft_model_pays_and_where_it_costs_k_tokens_it_cannot():
    flat = predict_gpu.predict(recording(), device(FLAT, 0.1), SHAPE, "test")["made-up"]
    assert flat["speedups"][DrafterKind.DRAFT] > 2.5 and flat["speedups"][DrafterKind.AUTO] > 2.5
    linear = predict_gpu.predict(recording(), device(LINEAR, 0.5), SHAPE, "test")["made-up"]
    assert linear["speedups"][DrafterKind.DRAFT] <= 1.0
    # nothing else to draft with: n-gram lookup and the suffix cache find nothing, and each costs nothing
    assert linear["speedups"][DrafterKind.NGRAM] == linear["speedups"][DrafterKind.SUFFIX] == pytest.approx(1.0)


def test_auto_drafts_with_the_draft_model_on_a_device_where_it_pays_and_not_where_it_does_not():
    flat = predict_gpu.predict(recording(), device(FLAT, 0.1), SHAPE, "test")["made-up"]
    assert flat["drafting"][DrafterKind.AUTO][DrafterKind.DRAFT]["steps"] > 0
    linear = predict_gpu.predict(recording(), device(LINEAR, 0.5), SHAPE, "test")["made-up"]
    assert DrafterKind.DRAFT not in linear["drafting"][DrafterKind.AUTO]
    assert linear["speedups"][DrafterKind.AUTO] == pytest.approx(1.0)
    # the draft model reads the prompt beside the target where it drafts every step, and in auto only where
    # it would pay: prefill, told apart from the decoding it prices
    prompt = len(recording()["sets"]["made-up"][0]["prompt"])
    read = predict_gpu.device_costs(device(FLAT, 0.1), SHAPE, "test").catch_up_seconds(DrafterKind.DRAFT, prompt)
    assert flat["prompt_seconds"][DrafterKind.DRAFT] == flat["prompt_seconds"][DrafterKind.AUTO] == pytest.approx(read)
    assert linear["prompt_seconds"][DrafterKind.AUTO] == 0.0 < linear["prompt_seconds"][DrafterKind.DRAFT]
    # a report whose draft stage did not run: no draft model, in auto neither
    without = predict_gpu.predict(recording(), device(FLAT, None), SHAPE, "test")["made-up"]
    assert DrafterKind.DRAFT not in without["speedups"] and without["speedups"][DrafterKind.AUTO] == pytest.approx(1.0)


def test_a_prompts_prediction_drafts_in_the_prediction_column_and_beside_every_drafter():
    made = recording(agrees=False)
    item = made["sets"]["made-up"][0]
    item["prediction"] = list(item["reply"])
    sets = predict_gpu.predict(made, device(FLAT, 0.1), SHAPE, "test")["made-up"]
    assert sets["speedups"][DrafterKind.PREDICTION] > 5
    beside_ngram = sets["drafting"][DrafterKind.NGRAM][DrafterKind.PREDICTION]
    assert beside_ngram["accepted"] == beside_ngram["drafted"] > 100


def test_the_suffix_cache_drafts_from_the_sets_earlier_replies():
    made = recording()
    first = made["sets"]["made-up"][0]
    made["sets"]["made-up"].append({**first, "prompt": list(range(3000, 3020))})  # the same reply again
    sets = predict_gpu.predict(made, device(FLAT, 0.1), SHAPE, "test")["made-up"]
    assert sets["drafting"][DrafterKind.SUFFIX][DrafterKind.SUFFIX]["accepted"] > 100


def test_mixed_sets_keep_the_earlier_sets_replies_to_draft_from():
    made = recording()
    made["sets"]["again"] = [{**made["sets"]["made-up"][0], "prompt": list(range(3000, 3020))}]
    fresh, mixed = (predict_gpu.predict(made, device(FLAT, 0.1), SHAPE, "test", mixed)["again"] for mixed in (False, True))
    assert fresh["drafting"][DrafterKind.SUFFIX] == {}
    assert mixed["drafting"][DrafterKind.SUFFIX][DrafterKind.SUFFIX]["accepted"] > 100


def run_script(name: str, *args, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *map(str, args)], capture_output=True,
                          text=True, env={**os.environ, "LOCALSPEC_HOME": str(home)}, timeout=300)


def test_record_then_predict_against_the_example_device_report(tiny, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "the cat sat on the mat", "prediction": "the cat sat on the mat"}) + "\n"
                       + json.dumps({"prompt": "the dog ran"}) + "\n")
    recorded = tmp_path / "replay.json"
    # the draft model is the target's twin: its likeliest token is the reply's own at every position
    done = run_script("replay.py", "record", "--target", tiny["target"], "--draft", tiny["same"], "--prompts", prompts,
                      "--max-tokens", 24, "-o", recorded, home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    items = json.loads(recorded.read_text())["sets"][str(prompts)]
    assert [len(item["draft"]["likeliest"]) for item in items] == [len(item["reply"]) for item in items] == [24, 24]
    agreed = sum(a == b for item in items for a, b in zip(item["draft"]["likeliest"], item["reply"]))
    assert agreed >= 0.9 * 48  # (batched logits may break a near-tie otherwise)
    assert "prediction" in items[0] and "prediction" not in items[1]

    table = run_script("predict_gpu.py", recorded, "--device", EXAMPLE_DEVICE, home=tmp_path / "home")
    assert table.returncode == 0, table.stderr
    assert "*Predicted* tokens/s against plain decoding on an illustrative GPU" in table.stdout
    assert f"| {prompts} | 2 | 48 |" in table.stdout and "| all sets | 2 | 48 |" in table.stdout
    assert "*Method.*" in table.stdout and "NOT a measurement" in table.stdout
    assert "Auto's own host work a step" in table.stdout and f"{prompts} " in table.stdout.split("host work a step")[1]
    figures = json.loads(run_script("predict_gpu.py", recorded, "--device", EXAMPLE_DEVICE, "--json",
                                    home=tmp_path / "home").stdout)
    assert set(figures["sets"][str(prompts)]["speedups"]) == set(predict_gpu.COLUMNS)
    assert figures["sets"][str(prompts)]["draft_model"]["acceptance_by_position"][0] >= 0.9
    assert 0 < figures["sets"][str(prompts)]["auto_host_seconds_a_step"] < 0.1
    assert 0 < figures["sets"][str(prompts)]["auto_host_share"] < 10
    # the older command reads the new recordings too
    assert run_script("replay.py", "simulate", recorded, home=tmp_path / "home").returncode == 0


@pytest.mark.parametrize("shape, recorded, message", [
    ("llama3.1-8b-shaped", {"sets": {}}, "has no llama3.1-8b-shaped target (it has: qwen2.5-1.5b-shaped)"),
    (SHAPE, {"sets": {"s": [{"prompt": [1], "reply": [2]}]}}, "holds no draft model's proposals"),
])
def test_a_report_without_the_shape_or_a_recording_without_drafts_is_refused_in_one_line(tmp_path, shape, recorded,
                                                                                         message):
    (tmp_path / "r.json").write_text(json.dumps(recorded))
    done = run_script("predict_gpu.py", tmp_path / "r.json", "--device", EXAMPLE_DEVICE, "--target-shape", shape,
                      home=tmp_path / "home")
    assert done.returncode != 0 and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_the_example_device_report_says_it_is_no_measurement_and_is_shaped_as_published_gpu_figures():
    example = json.loads(EXAMPLE_DEVICE.read_text())
    assert "NOT a measurement" in example["note"]
    costs = predict_gpu.device_costs(example, SHAPE, "example")
    assert costs.verify_seconds(4) / costs.level < 1.1 and costs.verify_seconds(32) / costs.level < 2
    assert 0.3 <= costs.drafts[DrafterKind.DRAFT].token <= 0.5
    assert draft_limit(Speculation(), DrafterKind.AUTO) + 1 <= max(costs.verify)


def test_a_bench_runs_draft_steps_are_priced_by_a_curve():
    assert predict_from_bench.curve_at({1: 1.0, 4: 2.5, 8: 3.0}, 2) == pytest.approx(1.5)
    assert predict_from_bench.curve_at({1: 1.0, 4: 2.5, 8: 3.0}, 12) == pytest.approx(4.5)  # beyond: as the engine
    assert predict_from_bench.curve_at({1: 1.0, 4: 2.5, 8: 3.0}, 2.5) == pytest.approx(1.75)  # between two sizes
    # ten steps of 3 drafted, all kept, and ten tokens of steps that drafted nothing
    row = {"tokens": 50, "drafters": {"draft": {"steps": 10, "drafted": 30, "accepted": 30}}}
    assert predict_from_bench.predicted(row, FLAT, 0.0, 0) == pytest.approx(50 / 20)  # every step costs one
    assert predict_from_bench.predicted(row, LINEAR, 0.0, 0) == pytest.approx(1.0)  # verify(4) costs 4 tokens
    # the draft's passes: 3 (or 4, unsure at the end) a drafting step, one where nothing was drafted
    assert predict_from_bench.predicted(row, FLAT, 0.5, 0) == pytest.approx(50 / (10 * 2.5 + 10 * 1.5))
    assert predict_from_bench.span(row, FLAT, 0.5) == f"{50 / (10 * 3 + 15):.2f}-{50 / 40:.2f}x"


def test_a_bench_run_of_draft_trees_is_refused_by_the_chain_model(tmp_path):
    run = {"draft": "d", "costs": {"verify_relative": {"1": 1.0, "4": 2.0}, "drafts": {"draft": {"token": 0.1}}},
           "results": [{"mode": "draft", "prompt_set": "p", "tokens": 20, "acceptance_rate": 0.5,
                        "mean_accepted_length": 2.0, "speedup": 1.0, "trees": {"steps": 3},
                        "drafters": {"draft": {"steps": 5, "drafted": 15, "accepted": 8}}}]}
    (tmp_path / "bench.json").write_text(json.dumps(run))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "predict_from_bench.py"), str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "verified draft trees" in done.stderr, done.stderr
    run["results"][0]["trees"]["steps"] = 0
    (tmp_path / "bench.json").write_text(json.dumps(run))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "predict_from_bench.py"), str(tmp_path / "bench.json")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "| p | d | 50% |" in done.stdout, done.stderr
