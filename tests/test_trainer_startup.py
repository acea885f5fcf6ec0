"""A training start reads and creates only what training uses, with the same result as before.

- ``load_target`` builds the decoder layers up to the last tapped one only (a later layer's
  weights are never read): its features equal those of the whole model loaded then cut
  bit for bit, and the target still reports (and checks taps against) its
  full layer count.
- ``build_drafter`` creates the drafter's parameters on the meta device first: its weights
  and buffers equal ``Drafter(...)`` + ``init_weights(seed)`` bit for bit, DFlash2 included.
- ``Tokenizers.load`` (the process's, held by its Runtime) loads a directory's tokenizer once
  (the mask token, the vocabulary length and the data all ask for it), again when a file of
  it changed.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dfo_contract.exitcodes import TrainerConfigError
from trainer.model.dflash2 import DFlash2Drafter, DFlash2Spec
from trainer.model.drafter import Drafter, DrafterSpec, SharedHead, build_drafter
from trainer.model.hf_load import from_pretrained
from trainer.model.target import Target, load_target, make_tiny_target


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_tiny_target(str(tmp_path_factory.mktemp("tgt") / "t"), layers=6)


def _old_way(path: str, taps: list[int]) -> Target:
    """Every layer loaded, then the ones after the last tap dropped."""
    t = Target(from_pretrained(path, torch.float32), taps, path)
    t.model.to("cpu")
    return t


@pytest.mark.parametrize("taps", [[0, 2], [1, 3, 4]])
def test_short_load_equals_full_load_then_cut(target_dir, taps):
    new = load_target(target_dir, device="cpu", dtype=torch.float32,
                      num_drafter_layers=len(taps), tap_ids=taps)
    old = _old_way(target_dir, taps)
    assert len(new.model.model.layers) == max(taps) + 1 == len(old.model.model.layers)
    assert new.num_layers_total == old.num_layers_total == 6
    # the model's config still names the whole target (export and init_from read it)
    assert new.config.num_hidden_layers == 6 and len(new.config.layer_types) == 6
    ids = torch.randint(4, 128, (2, 24), generator=torch.Generator().manual_seed(1))
    assert torch.equal(new.features(ids), old.features(ids))
    assert torch.equal(new.lm_head.weight, old.lm_head.weight)
    assert torch.equal(new.embed_tokens.weight, old.embed_tokens.weight)
    sd_new, sd_old = new.model.state_dict(), old.model.state_dict()
    assert list(sd_new) == list(sd_old)
    assert all(torch.equal(sd_new[k], sd_old[k]) for k in sd_new)
    assert not any(p.requires_grad for p in new.model.parameters())


def test_layers_after_the_last_tap_are_never_loaded(target_dir, tmp_path):
    """A later layer's weight of the wrong shape: the whole-model load refuses it, the
    short build never reads it."""
    import os
    import shutil

    from safetensors.torch import load_file, save_file

    bad = str(tmp_path / "bad")
    shutil.copytree(target_dir, bad)
    f = os.path.join(bad, "model.safetensors")
    sd = load_file(f)
    sd["model.layers.5.mlp.down_proj.weight"] = torch.zeros(3, 3)
    save_file(sd, f, metadata={"format": "pt"})
    with pytest.raises(RuntimeError):
        from_pretrained(bad, torch.float32)
    t = load_target(bad, device="cpu", dtype=torch.float32, num_drafter_layers=2, tap_ids=[0, 2])
    assert len(t.model.model.layers) == 3 and t.num_layers_total == 6


def test_taps_are_checked_against_the_full_layer_count(target_dir, tmp_path):
    with pytest.raises(TrainerConfigError, match="layer 5 is the last layer of the 6-layer target"):
        load_target(target_dir, device="cpu", dtype=torch.float32, num_drafter_layers=2,
                    tap_ids=[1, 5])
    with pytest.raises(TrainerConfigError, match="has no config.json"):
        load_target(str(tmp_path), device="cpu", dtype=torch.float32, num_drafter_layers=1)
    with pytest.raises(TrainerConfigError, match="--model.target_path: required"):
        load_target("", device="cpu", dtype=torch.float32, num_drafter_layers=1)


def _spec():
    from trainer.model.target import tiny_qwen3_config

    return DrafterSpec.from_target_config(tiny_qwen3_config(), num_layers=2, num_taps=2)


def _makers():
    spec = _spec()
    shared = SharedHead(nn.Embedding(128, 64), nn.Linear(64, 128, bias=False))
    d2 = DFlash2Spec(block_size=8, selector_rank=8, selector_top_k=4)
    return {"dflash": lambda: Drafter(spec, shared),
            "dflash2": lambda: DFlash2Drafter(spec, d2, shared)}


@pytest.mark.parametrize("method", ["dflash", "dflash2"])
def test_build_drafter_equals_construct_then_init(method):
    make = _makers()[method]
    old = make()
    old.init_weights(7)
    new = build_drafter(make, device="cpu", seed=7)
    assert not any(p.is_meta for p in new.parameters())
    sd_old, sd_new = old.state_dict(), new.state_dict()
    assert list(sd_old) == list(sd_new)
    assert all(torch.equal(sd_old[k], sd_new[k]) for k in sd_old)
    assert all(torch.equal(a, b) for a, b in zip(old.buffers(), new.buffers(), strict=True))
    assert ([n for n, p in old.named_parameters() if p.requires_grad]
            == [n for n, p in new.named_parameters() if p.requires_grad])
    # the shared head is the caller's, not a copy
    assert new.shared.lm_head is old.shared.lm_head
    # and the seed matters (the comparison above can fail)
    other = build_drafter(make, device="cpu", seed=8)
    assert not torch.equal(other.fc.weight, new.fc.weight)


def test_tokenizer_is_loaded_once_per_directory_until_it_changes(target_dir, tmp_path):
    import os
    import shutil

    from trainer.data.tokenizer import Tokenizers

    load_tokenizer = Tokenizers().load
    copy = str(tmp_path / "t")
    shutil.copytree(target_dir, copy)
    first = load_tokenizer(copy)
    assert first is not None and load_tokenizer(copy) is first
    assert load_tokenizer(target_dir) is not first  # another directory
    cfg = os.path.join(copy, "tokenizer_config.json")
    st = os.stat(cfg)
    os.utime(cfg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    again = load_tokenizer(copy)
    assert again is not first and len(again) == len(first)
    assert load_tokenizer(str(tmp_path)) is None  # no tokenizer there
