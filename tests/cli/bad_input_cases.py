"""The standing bad-input corpus (issue 14): user mistakes for every command, each with the exit code and the
message fragments it must give. tests/cli/test_bad_input_corpus.py builds the files and runs them.

A case is (command group, args, needles, exit code). In args and needles, {S} is the store, {W} the work
directory holding the bad files (see `make_files`), {TAU2} a real τ²-bench results file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from trace_testing import TAU2_DIR, TAU2_FILES, episode, write_jsonl

# 9 levels of 9 aliases: ~387 million values once expanded
BOMB = "".join(
    [
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n',
        *(f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
    ]
)
DEEP_YAML = "a: " + "[" * 500 + "]" * 500 + "\n"
INT64_PLUS = "0:99999999999999999999"
NOT_FILE = ["is a FIFO (named pipe), not a regular file"]
LOOP = ["symbolic link loop"]

RECIPE_HEAD = "kind: recipe\nversion: 1\nsteps:\n"


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def make_files(w: Path, model_hf: Path) -> None:
    """Every bad input the cases name, under `w`; `model_hf` is a good tiny model directory to spoil."""
    import shutil

    write_jsonl(w / "good.jsonl", [episode("g1"), episode("g2", reward=0.0)])
    (w / "deep.json").write_text('{"simulations": ' + _deep(100_000) + "}")
    (w / "deep.jsonl").write_text('{"messages": ' + _deep(100_000) + "}\n")
    e = episode("d1")
    e["messages"][2]["tool_calls"][0]["function"]["arguments"] = '{"a": ' + _deep(3000) + "}"
    write_jsonl(w / "deeparg.jsonl", [e, episode("ok")])
    write_jsonl(w / "allbad.jsonl", ["{", '{"task_id": 1}'])
    write_jsonl(w / "nan.jsonl", [json.dumps(episode("n1")).replace('"reward": 1.0', '"reward": NaN')])
    write_jsonl(w / "big_reward.jsonl", [episode("b1", reward=7.5)])
    write_jsonl(w / "dup_ids.jsonl", [episode("x"), episode("x")])
    (w / "pretty.jsonl").write_text(json.dumps([episode("p1"), episode("p2")], indent=2))
    (w / "empty.json").write_text("")
    (w / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    (w / "adir").mkdir()
    os.mkfifo(w / "fifo")
    os.symlink("loop2", w / "loop1")
    os.symlink("loop1", w / "loop2")
    os.symlink("nowhere", w / "dangling")
    # models: pickled weights, none at all, a file instead of a directory
    for d in ("pickled", "pkl", "noweights"):
        shutil.copytree(model_hf, w / d)
        (w / d / "model.safetensors").unlink()
    import safetensors.torch
    import torch

    torch.save(
        safetensors.torch.load_file(model_hf / "model.safetensors"), w / "pickled" / "pytorch_model.bin"
    )
    (w / "pkl" / "model.pkl").write_bytes(b"\x80\x04K\x01.")
    (w / "weights.txt").write_text("not a model")
    # configs
    (w / "train_typos.yaml").write_text("method: grpo\nmodle: x\nenv: shop\nlearning_rat: 1e-5\n")
    (w / "train_dup.yaml").write_text("method: sft\nmethod: grpo\nenv: shop\nmodel: x\n")
    (w / "bomb.yaml").write_text(BOMB)
    (w / "deep.yaml").write_text(DEEP_YAML)
    (w / "train_list.yaml").write_text("- method: sft\n")
    (w / "compose_typos.yaml").write_text("method: router\nadapterz: [a, b]\n")
    (w / "pretrain_typos.yaml").write_text("max_stesp: 10\n")
    # candidates
    (w / "cand_syntax.yaml").write_text("capabilities: [unclosed\n")
    (w / "cand_dup.yaml").write_text("kind: capabilities\nkind: capabilities\ncapabilities: []\n")
    (w / "cand_schema.yaml").write_text("capabilities:\n  - name: x\n")
    (w / "cand_latin1.yaml").write_bytes(b"\xff\xfe")
    # recipes
    step = "  - id: a\n    uses: ingest\n    with: {format: jsonl, path: good.jsonl}\n"
    (w / "r_dup.yaml").write_text(RECIPE_HEAD + step.replace("    uses", "    uses: ingest\n    uses", 1))
    (w / "r_unknown_stage.yaml").write_text(RECIPE_HEAD + step.replace("uses: ingest", "uses: ingestt"))
    (w / "r_dangling.yaml").write_text(
        RECIPE_HEAD
        + "  - id: d\n    uses: diagnose\n    with: {rollouts: '${steps.nope.outputs.rollouts}'}\n"
    )
    (w / "r_seeds.yaml").write_text(
        RECIPE_HEAD + "  - id: s\n    uses: synthesize\n    with:\n      diagnosis: store://diagnosis/diag\n"
        "      capability: precondition_verification\n      model: policy:random\n"
        f"      seeds: {{train: '{INT64_PLUS}', eval: '1000:1100'}}\n"
    )
    (w / "r_eval_seeds.yaml").write_text(
        RECIPE_HEAD + "  - id: e\n    uses: eval\n    with: {model: policy:reference, env: shop, "
        f"seeds: '{INT64_PLUS}'}}\n"
    )
    (w / "r_list.yaml").write_text("- just\n- a list\n")
    (w / "ingest_cfg_typo.yaml").write_text("kind: ingest\nformat: jsonl\npaht: good.jsonl\n")
    (w / "out_exists.json").write_text("{}")
    # issue 25 item 9: JSON Lines where a τ²-bench file or a recipe belongs; a plain (alias-free) 5 MB recipe
    (w / "episodes_as.json").write_text((w / "good.jsonl").read_text())
    (w / "episodes_as.yaml").write_text((w / "good.jsonl").read_text())
    with open(w / "r_big.yaml", "w") as fh:
        fh.write(RECIPE_HEAD)
        for i in range(60_000):
            fh.write(f"  - id: s{i}\n    uses: ingest\n    with: {{format: jsonl, path: good.jsonl}}\n")


EVAL_REFERENCE = ["eval", "--model", "policy:reference", "--env", "shop"]
SYNTH_RANDOM = ["synthesize", "--diagnosis", "store://diagnosis/diag", "--model", "policy:random"]
DIAGNOSE_GOOD = ["diagnose", "--rollouts", "store://rollouts/good"]


def _c(group, args, needles, code=2):
    return (group, args, needles, code)


CASES: dict[str, tuple[str, list[str], list[str], int]] = {
    # ----------------------------------------------------------------------------------- ingest tau2
    "tau2_deep_json": _c("ingest tau2", ["ingest", "tau2", "{W}/deep.json"], ["JSON nested too deeply"]),
    "tau2_fifo": _c("ingest tau2", ["ingest", "tau2", "{W}/fifo"], ["{W}/fifo", *NOT_FILE]),
    "tau2_symlink_loop": _c("ingest tau2", ["ingest", "tau2", "{W}/loop1"], ["{W}/loop1", *LOOP]),
    "tau2_dangling_link": _c("ingest tau2", ["ingest", "tau2", "{W}/dangling"], ["dangling symbolic link"]),
    "tau2_jsonl_given": _c(
        "ingest tau2",
        ["ingest", "tau2", "{W}/good.jsonl"],
        ["{W}/good.jsonl: looks like JSON Lines", "trace ingest jsonl {W}/good.jsonl"],
    ),
    "tau2_jsonl_named_json": _c(
        "ingest tau2",
        ["ingest", "tau2", "{W}/episodes_as.json"],
        ["looks like JSON Lines", "trace ingest jsonl {W}/episodes_as.json"],
    ),
    "tau2_empty": _c("ingest tau2", ["ingest", "tau2", "{W}/empty.json"], ["the file is empty"]),
    "tau2_missing": _c("ingest tau2", ["ingest", "tau2", "{W}/nope.json"], ["nope.json: no such file"]),
    "tau2_dir_without_results": _c(
        "ingest tau2", ["ingest", "tau2", "{W}/adir"], ["not a τ²-bench run directory (no results.json)"]
    ),
    "tau2_bad_on_error": _c(
        "ingest tau2", ["ingest", "tau2", "{TAU2}", "--on-error", "ignore"], ["'ignore' is not one of"]
    ),
    # ----------------------------------------------------------------------------------- ingest jsonl
    "jsonl_deep_record": _c(
        "ingest jsonl", ["ingest", "jsonl", "{W}/deep.jsonl"], ["line 1: JSON nested too"]
    ),
    "jsonl_deep_arguments": _c(
        "ingest jsonl", ["ingest", "jsonl", "{W}/deeparg.jsonl"], ["line 1: JSON nested too deeply"]
    ),
    "jsonl_tau2_given": _c(
        "ingest jsonl",
        ["ingest", "jsonl", "{TAU2}"],
        ["this looks like a τ²-bench results file", "trace ingest tau2"],
    ),
    "jsonl_pretty_array": _c(
        "ingest jsonl", ["ingest", "jsonl", "{W}/pretty.jsonl"], ["one JSON array spread over several lines"]
    ),
    "jsonl_skip_all_bad": _c(
        "ingest jsonl",
        ["ingest", "jsonl", "{W}/allbad.jsonl", "--on-error", "skip"],
        ["no records to ingest (2 rejected)", "line 1: not valid JSON", "at least one good record"],
    ),
    "jsonl_nan_reward": _c("ingest jsonl", ["ingest", "jsonl", "{W}/nan.jsonl"], ["line 1", "reward"]),
    "jsonl_reward_out_of_range": _c(
        "ingest jsonl", ["ingest", "jsonl", "{W}/big_reward.jsonl"], ["line 1", "reward", "7.5"]
    ),
    "jsonl_duplicate_ids": _c(
        "ingest jsonl",
        ["ingest", "jsonl", "{W}/dup_ids.jsonl"],
        ["line 2", "duplicate 'x' (first on line 1)"],
    ),
    "jsonl_fifo": _c("ingest jsonl", ["ingest", "jsonl", "{W}/fifo"], NOT_FILE),
    "jsonl_symlink_loop": _c("ingest jsonl", ["ingest", "jsonl", "{W}/loop1"], LOOP),
    "jsonl_binary": _c("ingest jsonl", ["ingest", "jsonl", "{W}/binary.jsonl"], ["not a UTF-8 text file"]),
    "jsonl_directory": _c("ingest jsonl", ["ingest", "jsonl", "{W}/adir"], ["is a directory"]),
    "ingest_unknown_format": _c(
        "ingest jsonl", ["ingest", "xml", "{W}/good.jsonl"], ["No such command 'xml'"]
    ),
    # ----------------------------------------------------------------------------------- eval
    **{
        f"eval_{case}": _c("eval", [*EVAL_REFERENCE, "--seeds", seeds], needles)
        for case, (seeds, needles) in {
            "seeds_beyond_int64": (INT64_PLUS, ["2**63-1"]),
            "ten_billion_seeds": ("0:9999999999", ["at most 1,000,000 per run"]),
            "seeds_not_a_range": ("abc", ["not a range A:B"]),
            "seeds_empty": ("5:5", ["empty or negative"]),
        }.items()
    },
    "eval_pickled_model": _c(
        "eval",
        ["eval", "--model", "{W}/pickled", "--env", "shop", "--seeds", "0:2"],
        ["the weights are pickled (pytorch_model.bin)", "safetensors only"],
    ),
    "eval_pkl_model": _c(
        "eval", ["eval", "--model", "{W}/pkl", "--env", "shop", "--seeds", "0:2"], ["pickled (model.pkl)"]
    ),
    "eval_model_without_weights": _c(
        "eval", ["eval", "--model", "{W}/noweights", "--env", "shop", "--seeds", "0:2"], ["has no weights"]
    ),
    "eval_model_is_a_file": _c(
        "eval", ["eval", "--model", "{W}/weights.txt", "--env", "shop"], ["must be a directory, not a file"]
    ),
    "eval_unknown_env": _c("eval", ["eval", "--model", "policy:reference", "--env", "shopp"], ["shopp"]),
    "eval_unknown_policy": _c(
        "eval",
        ["eval", "--model", "policy:nope", "--env", "shop"],
        ["unknown built-in", "policy:reference, policy:random, policy:demonstration?deficits="],
    ),
    "eval_missing_artifact": _c("eval", ["eval", "--model", "store://model/nope", "--env", "shop"], ["nope"]),
    # ----------------------------------------------------------------------------------- train
    "train_config_typos": _c(
        "train",
        ["train", "--config", "{W}/train_typos.yaml"],
        [
            "train_typos.yaml: 3 validation errors",
            "modle: unknown key; did you mean 'model'?",
            "learning_rat: unknown key; did you mean 'learning_rate'?",
            "'model' is a required property",
        ],
    ),
    "train_config_duplicate_key": _c(
        "train", ["train", "--config", "{W}/train_dup.yaml"], ["train_dup.yaml:2:1", "duplicate key 'method'"]
    ),
    "train_config_alias_bomb": _c("train", ["train", "--config", "{W}/bomb.yaml"], ["alias bomb"]),
    "train_config_deep": _c(
        "train", ["train", "--config", "{W}/deep.yaml"], ["nested deeper than 100 levels"]
    ),
    "train_config_fifo": _c("train", ["train", "--config", "{W}/fifo"], NOT_FILE),
    "train_config_list": _c(
        "train", ["train", "--config", "{W}/train_list.yaml"], ["train_list.yaml: expected a mapping"]
    ),
    "train_seeds_beyond_int64": _c(
        "train",
        ["train", "--method", "sft", "--model", "store://model/tiny", "--env", "shop", "--seeds", INT64_PLUS],
        ["2**63-1"],
    ),
    "train_pickled_model": _c(
        "train",
        ["train", "--method", "sft", "--model", "{W}/pickled", "--env", "shop"],
        ["weights are pickled"],
    ),
    "train_set_unknown_key": _c(
        "train",
        ["train", "--method", "sft", "--model", "store://model/tiny", "--env", "shop", "--set", "epohcs=2"],
        ["epohcs: unknown key; did you mean 'epochs'?"],
    ),
    "train_bad_method": _c("train", ["train", "--method", "ppo"], ["'ppo' is not one of"]),
    # ----------------------------------------------------------------------------------- synthesize
    "synth_missing_diagnosis": _c(
        "synthesize",
        ["synthesize", "--diagnosis", "store://diagnosis/nope", "--model", "policy:random"],
        ["nope"],
    ),
    "synth_not_selected": _c(
        "synthesize",
        [*SYNTH_RANDOM, "--capability", "zz"],
        ["'zz' is not selected"],
    ),
    "synth_pickled_model": _c(
        "synthesize",
        ["synthesize", "--diagnosis", "store://diagnosis/diag", "--model", "{W}/pickled"],
        ["weights are pickled"],
    ),
    "synth_seeds_beyond_int64": _c("synthesize", ["run", "{W}/r_seeds.yaml"], ["seeds.train", "2**63-1"]),
    "synth_openai_without_url": _c(
        "synthesize",
        [*SYNTH_RANDOM, "--author", "openai"],
        ["base_url"],
    ),
    # ----------------------------------------------------------------------------------- diagnose
    **{
        f"diag_candidates_{case}": _c("diagnose", [*DIAGNOSE_GOOD, "--candidates", f"{{W}}/{file}"], needles)
        for case, (file, needles) in {
            "syntax": ("cand_syntax.yaml", ["candidates: {W}/cand_syntax.yaml:2:1: invalid YAML"]),
            "duplicate_key": ("cand_dup.yaml", ["duplicate key 'kind'"]),
            "schema": (
                "cand_schema.yaml",
                ["cand_schema.yaml: 2 validation errors", "'description' is a required property"],
            ),
            "not_utf8": ("cand_latin1.yaml", ["not a UTF-8 text file"]),
            "fifo": ("fifo", NOT_FILE),
            "dir": ("adir", ["directory"]),
            "missing": ("nope.yaml", ["no such file (use 'catalog', 'discover' or a capabilities YAML)"]),
        }.items()
    },
    "diag_min_runs_over_runs": _c(
        "diagnose",
        [*DIAGNOSE_GOOD, "--runs", "3", "--min-runs", "5"],
        ["min_runs (K=5) cannot exceed runs (N=3)"],
    ),
    "diag_missing_rollouts": _c("diagnose", ["diagnose", "--rollouts", "store://rollouts/nope"], ["nope"]),
    # ----------------------------------------------------------------------------------- model / pretrain
    "model_bad_preset": _c("model", ["model", "init", "--preset", "huge"], ["'huge' is not one of"]),
    "model_import_pickled": _c("model", ["model", "import", "{W}/pickled"], ["weights are pickled"]),
    "model_import_missing": _c("model", ["model", "import", "{W}/nope"], ["not found"]),
    "model_import_text_file": _c("model", ["model", "import", "{W}/weights.txt"], ["must be a .gguf file"]),
    "model_show_missing": _c("model", ["model", "show", "store://model/nope"], ["nope"]),
    "pretrain_pickled_model": _c("pretrain", ["model", "pretrain", "--model", "{W}/pickled"], ["pickled"]),
    "pretrain_config_typo": _c(
        "pretrain",
        ["model", "pretrain", "--model", "store://model/tiny", "--config", "{W}/pretrain_typos.yaml"],
        ["max_stesp: unknown key; did you mean 'max_steps'?"],
    ),
    "pretrain_config_bomb": _c(
        "pretrain",
        ["model", "pretrain", "--model", "store://model/tiny", "--config", "{W}/bomb.yaml"],
        ["bomb"],
    ),
    # ----------------------------------------------------------------------------------- run / status / validate
    "run_duplicate_key": _c("run", ["run", "{W}/r_dup.yaml"], ["r_dup.yaml:6:5", "duplicate key 'uses'"]),
    "run_alias_bomb": _c("run", ["run", "{W}/bomb.yaml"], ["alias bomb"]),
    "run_unknown_stage": _c("run", ["run", "{W}/r_unknown_stage.yaml"], ["ingestt"]),
    "run_dangling_reference": _c(
        "run", ["run", "{W}/r_dangling.yaml"], ["dangling reference", "no step 'nope'"]
    ),
    "run_eval_seeds_beyond_int64": _c("run", ["run", "{W}/r_eval_seeds.yaml"], ["2**63-1"]),
    "run_symlink_loop": _c("run", ["run", "{W}/loop1"], LOOP),
    "run_not_a_mapping": _c("run", ["run", "{W}/r_list.yaml"], ["r_list.yaml"]),
    "run_jsonl_given": _c(
        "run", ["run", "{W}/good.jsonl"], ["good.jsonl: a JSON Lines data file", "trace ingest jsonl"]
    ),
    "run_jsonl_named_yaml": _c(
        "run", ["run", "{W}/episodes_as.yaml"], ["episodes_as.yaml:2:1: invalid YAML", "trace ingest jsonl"]
    ),
    "run_plain_big_recipe": _c(
        "run",
        ["run", "{W}/r_big.yaml"],
        ["r_big.yaml:", "bytes; config and recipe files are limited to 4 MiB"],
    ),
    "validate_plain_big_recipe": _c(
        "validate", ["validate", "{W}/r_big.yaml"], ["config and recipe files are limited to 4 MiB"]
    ),
    "status_fifo": _c("status", ["status", "{W}/fifo"], NOT_FILE),
    "status_deep_yaml": _c("status", ["status", "{W}/deep.yaml"], ["nested deeper than 100 levels"]),
    "status_missing": _c("status", ["status", "{W}/nope.yaml"], ["nope.yaml: no such file"]),
    "validate_fifo": _c("validate", ["validate", "{W}/fifo"], NOT_FILE),
    "validate_symlink_loop": _c("validate", ["validate", "{W}/loop1"], LOOP),
    "validate_dangling_link": _c("validate", ["validate", "{W}/dangling"], ["dangling symbolic link"]),
    "validate_config_typo": _c(
        "validate", ["validate", "{W}/ingest_cfg_typo.yaml"], ["paht: unknown key; did you mean 'path'?"]
    ),
    "validate_deep_jsonl": _c("validate", ["validate", "{W}/deep.jsonl"], ["line 1: JSON nested too deeply"]),
    # ----------------------------------------------------------------------------------- store
    "sql_copy_to": _c("store sql", ["store", "sql", "COPY episodes TO '{W}/x.parquet'"], ["COPY"]),
    "sql_read_outside": _c("store sql", ["store", "sql", "SELECT * FROM read_text('/etc/passwd')"], []),
    "sql_empty": _c("store sql", ["store", "sql", "  "], ["empty SQL query"]),
    "sql_syntax": _c("store sql", ["store", "sql", "SELEC 1"], ["SELEC"]),
    "sql_update_extensions": _c("store sql", ["store", "sql", "UPDATE EXTENSIONS"], ["refused SQL"]),
    "sql_explain_copy_with_options": _c(
        "store sql", ["store", "sql", "EXPLAIN (FORMAT json) COPY episodes TO '{W}/x.parquet'"], ["COPY"]
    ),
    "ls_bad_kind": _c("store ls", ["store", "ls", "--kind", "rollout"], ["'rollout' is not one of"]),
    "show_missing": _c("store ls", ["store", "show", "nope"], ["nope"]),
    "verify_missing_store": _c(
        "store verify", ["store", "verify", "--store", "{W}/nostore"], ["does not exist"]
    ),
    "gc_missing_store": _c("store gc", ["store", "gc", "--store", "{W}/nostore"], ["does not exist"]),
    "reindex_store_is_a_file": _c(
        "store reindex", ["store", "reindex", "--store", "{W}/weights.txt"], ["weights.txt' is a file"]
    ),
    "ls_store_dev_null": _c("store ls", ["store", "ls", "--store", "/dev/null"], ["is not a directory"]),
    # ----------------------------------------------------------------------------------- export / serve / compose
    "export_missing_artifact": _c(
        "export", ["export", "jsonl", "store://rollouts/nope", "--out", "{W}/o.jsonl"], ["nope"]
    ),
    "export_out_exists": _c(
        "export", ["export", "tau2", "store://rollouts/good", "--out", "{W}/out_exists.json"], ["--force"]
    ),
    "export_not_rollouts": _c(
        "export", ["export", "tau2", "store://model/tiny", "--out", "{W}/o.json"], ["rollouts"]
    ),
    "export_into_missing_dir": _c(
        "export",
        ["export", "jsonl", "store://rollouts/good", "--out", "{W}/no/such/dir/o.jsonl"],
        ["no/such/dir"],
    ),
    "serve_pickled_model": _c("serve", ["serve", "{W}/pickled", "--port", "0"], ["weights are pickled"]),
    "serve_missing_model": _c("serve", ["serve", "store://model/nope", "--port", "0"], ["nope"]),
    "compose_one_adapter": _c(
        "compose", ["compose", "--method", "router", "--adapter", "store://adapter/nope"], ["adapter"]
    ),
    "compose_config_typo": _c(
        "compose", ["compose", "--config", "{W}/compose_typos.yaml"], ["--adapter is required"]
    ),
    "compose_config_fifo": _c("compose", ["compose", "--config", "{W}/fifo"], NOT_FILE),
}


def tau2_file() -> Path:
    return TAU2_DIR / TAU2_FILES["telecom"]
