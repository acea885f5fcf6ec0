"""What an export says about its drafter: ``config.json``'s object and the README (pure).

The config describes the drafter as it is, not as the target is:

- RoPE both ways: ``rope_parameters`` (transformers 5) and the top-level ``rope_theta`` +
  ``rope_scaling`` (transformers 4, z-lab's MLX loader, z-lab's published configs), the
  same values;
- the layers' attention (``layer_types``, ``sliding_window``, ``is_causal``) is added by
  ``trainer.evaluate.served.export_fields``, exactly as trained;
- no biases (``attention_bias: false``), SiLU MLP, an explicit ``head_dim``;
- ``auto_map`` to the shipped ``modeling_dflash.py``, so transformers'
  ``trust_remote_code`` builds the DFlash module, not a plain Qwen3 model.
"""

from __future__ import annotations

import os

from dfo_contract.trainer_config.methods import DEFAULT_METHOD, contract

MODULE_FILE = "modeling_dflash.py"
# the shipped module: trainer/model/modeling_dflash.py (copied, never imported here)
MODULE_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "model", MODULE_FILE)
AUTO_MAP = {"AutoModel": "modeling_dflash.DFlashDraftModel"}
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_DROP = ("auto_map", "_name_or_path", "quantization_config", "transformers_version",
         "rope_theta", "rope_scaling", "rope_parameters", "sliding_window", "use_sliding_window",
         "max_window_layers", "layer_types")


def rope_fields(rope: dict) -> dict:
    """``rope_parameters`` plus the same RoPE as transformers 4's ``rope_theta`` /
    ``rope_scaling`` (None for plain RoPE)."""
    rope = dict(rope)
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    plain = scaling.get("rope_type", "default") == "default" and set(scaling) <= {"rope_type"}
    return {"rope_parameters": rope, "rope_theta": float(rope["rope_theta"]),
            "rope_scaling": None if plain else scaling}


def drafter_config(tcfg, *, num_layers: int, tap_ids: list[int], num_target_layers: int,
                   block_size: int, mask_token_id: int, dtype: str, head_dim: int) -> dict:
    """config.json's object: the target's width, heads, MLP size, eps, vocab, RoPE and
    positions, with the drafter's own fields on top."""
    from ..model.rope import rope_parameters_of

    c = {k: v for k, v in tcfg.to_dict().items() if k not in _DROP}
    c.update(rope_fields(rope_parameters_of(tcfg)))
    c["architectures"] = ["DFlashDraftModel"]
    c["auto_map"] = dict(AUTO_MAP)
    c["model_type"] = "qwen3"
    c["num_hidden_layers"] = int(num_layers)
    c["head_dim"] = int(head_dim)
    c["attention_bias"] = False
    if "mlp_bias" in c:
        c["mlp_bias"] = False
    c["hidden_act"] = "silu"
    c["num_target_layers"] = int(num_target_layers)
    c["block_size"] = int(block_size)
    c["dflash_config"] = {"mask_token_id": int(mask_token_id), "target_layer_ids": list(tap_ids),
                          "block_size": int(block_size)}
    c["dtype"] = c["torch_dtype"] = DTYPES[dtype]
    c["tie_word_embeddings"] = False
    c["use_cache"] = True
    return c


def readme(*, target: str, data: str, steps: int, accept_len, block_size: int, layers: int,
           tap_ids, source: str, init_from: str = "", method: str = DEFAULT_METHOD) -> str:
    al = f"{accept_len:.3f}" if isinstance(accept_len, (int, float)) else "not measured"
    start = f"- initial weights: `{init_from}`\n" if init_from else ""
    c = contract(method)
    name = c.label
    # vLLM and SGLang take a DFlash2 drafter under their DFlash method and tell the two
    # apart by `architectures`; only DFlash ships a trust_remote_code module
    hf = (f"- transformers: no module ships with a {name} drafter; `python -m trainer eval "
          "THIS_DIR` loads it.\n\n") if not c.remote_code else (
        "- transformers: `AutoModel.from_pretrained(THIS_DIR, trust_remote_code=True)` builds "
        f"the drafter from the shipped `{MODULE_FILE}` (torch + transformers only) and loads "
        "every weight; its `forward(position_ids, noise_embedding, target_hidden, ...)` follows "
        "z-lab's DFlash generation loop. The embedding and LM head are the target's.\n\n")
    tune = "`--model.init_from THIS_DIR`" if method == DEFAULT_METHOD else \
        f"`--model.method {method} --model.init_from THIS_DIR`"
    return (
        f"# {name} drafter\n\n"
        f"A block-diffusion speculative-decoding drafter ({name}) trained with dfo's bundled "
        "trainer.\n\n"
        f"- target: `{target}`\n- training data: `{data}`\n- steps: {steps}\n{start}"
        f"- block size: {block_size}; drafter layers: {layers}; target layers tapped: {list(tap_ids)}\n"
        f"- measured acceptance length on held-out data (1 + leading correct draft tokens per "
        f"block, mean): {al}\n- source checkpoint: `{source}`\n\n"
        "## Serve it\n\n"
        "- vLLM: `vllm serve TARGET --speculative-config '{\"method\": \"dflash\", \"model\": "
        f"\"THIS_DIR\", \"num_speculative_tokens\": {block_size - 1}}}'` (Python: "
        "`LLM(model=TARGET, speculative_config={\"method\": \"dflash\", \"model\": \"THIS_DIR\", "
        f"\"num_speculative_tokens\": {block_size - 1}}})`).\n"
        "- SGLang: `--speculative-algorithm DFLASH --speculative-draft-model-path THIS_DIR "
        f"--speculative-num-draft-tokens {block_size}`.\n"
        f"{hf}"
        "Measure it on your prompts with `python -m trainer eval THIS_DIR --target TARGET "
        f"--prompts FILE --spec-decode N`; fine-tune it with {tune}.\n")
