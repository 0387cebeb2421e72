"""Config: typed keys from TOML and the CLI; every mistake is one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import ConfigError, apply_overrides, config_from_dict, load_config

TINY = Path(__file__).resolve().parents[2] / "trainer" / "configs" / "tiny-cpu.toml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_shipped_tiny_config_loads():
    cfg = load_config(TINY)
    assert cfg.name == "tiny-cpu"
    assert cfg.runtime.targets == ["cpu", "cpu"] and cfg.runtime.drafters == ["cpu", "cpu"]
    assert cfg.drafter.num_layers == 2


def test_overrides_parse_toml_values():
    cfg = load_config(
        TINY,
        ["train.lr=1e-4", "data.seq_buckets=[64, 128]", "train.attention=sdpa", "name=x y"],
    )
    assert cfg.train.lr == 1e-4
    assert cfg.data.seq_buckets == [64, 128]
    assert cfg.name == "x y"


def test_ints_are_accepted_as_floats_but_not_the_reverse():
    cfg = load_config(None, ["train.lr=1"])
    assert cfg.train.lr == 1.0 and isinstance(cfg.train.lr, float)
    with pytest.raises(
        ConfigError, match=r"^config: train\.batch_size = 1\.5: expected an integer$"
    ):
        load_config(None, ["train.batch_size=1.5"])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[train]\nlrr = 1.0\n", "train.lrr = 1.0: unknown key (did you mean train.lr?)"),
        ("[trian]\nlr = 1.0\n", "trian = {...}: unknown key (did you mean train?)"),
        ("[train]\nlr = 'fast'\n", 'train.lr = "fast": expected a number'),
        ("[train]\nattention = 'magic'\n", 'train.attention = "magic": expected one of auto,'),
        ("[data]\nseq_buckets = 5\n", "data.seq_buckets = 5: expected a list"),
        ("[data]\nseq_buckets = [256, 128]\n", "= [256, 128]: must be strictly increasing"),
        ("train = 3\n", "train = 3: expected a [train] table"),
        ("[train\n", "c.toml"),
    ],
)
def test_bad_files_give_one_line_naming_the_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, text))
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_bad_override_names_the_key():
    with pytest.raises(ConfigError, match=r"^config: train\.nope = 1: unknown key$"):
        load_config(TINY, ["train.nope=1"])
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        load_config(TINY, ["train.lr"])


def test_device_lists_take_gpu_indices_and_refuse_nonsense():
    cfg = load_config(None, ["runtime.targets=[0, 1, 2]", 'runtime.drafters=["cuda:3", "cpu"]'])
    assert cfg.runtime.targets == ["cuda:0", "cuda:1", "cuda:2"]
    assert cfg.runtime.drafters == ["cuda:3", "cpu"]
    with pytest.raises(ConfigError, match=r"runtime\.drafters\[0\] = \"gpu7\": not a device"):
        load_config(None, ['runtime.drafters=["gpu7"]'])
    with pytest.raises(ConfigError, match=r"runtime\.targets = \[\]: expected a non-empty list"):
        load_config(None, ["runtime.targets=[]"])
    with pytest.raises(ConfigError, match=r"runtime\.heartbeat_interval"):
        load_config(None, ["runtime.heartbeat_interval=5"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")


def test_round_trip_through_config_json():
    cfg = load_config(TINY, ["train.seed=7"])
    again = config_from_dict({**cfg.to_dict(), "run": {"run_id": "x"}})
    assert again == cfg
    assert apply_overrides(again, ["train.seed=8"]).train.seed == 8
