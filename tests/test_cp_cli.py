"""`--cp`: parsing and the checks that run before any weights load (exit 2 on mistakes)."""

import pytest

from sagegen.cli.cp_option import CpSpec, check_cp, parse_cp
from sagegen.cli.errors import UsageProblem
from sagegen.models.presets import resolve

TORCHRUN = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_parse():
    assert parse_cp("ulysses=2,ring=2") == CpSpec(2, 2)
    assert parse_cp(" Ring=4 ") == CpSpec(1, 4)
    assert parse_cp("ulysses=8").world == 8
    for bad, why in [("ulysses=2,ulysses=2", "at most once"), ("u=2", "ulysses=U,ring=R"), ("ring=x", "integer"),
                     ("ring=0", "at least 1"), ("ulysses=1", "product"), ("ulysses2", "ulysses=U,ring=R")]:
        with pytest.raises(UsageProblem, match=why):
            parse_cp(bad)


def test_checks_before_loading():
    env = dict(TORCHRUN)
    assert check_cp(None, resolve("hunyuanvideo"), environ=env) is None
    assert check_cp("ulysses=2,ring=2", resolve("hunyuanvideo"), environ=env) == CpSpec(2, 2)   # 24 heads
    assert check_cp("ring=4", resolve("flux.1-dev"), environ=env) == CpSpec(1, 4)
    with pytest.raises(UsageProblem, match="torchrun.*missing RANK, WORLD_SIZE"):
        check_cp("ring=2", resolve("flux.1-dev"), environ={})
    with pytest.raises(UsageProblem, match="= 2 processes, but torchrun started 4"):
        check_cp("ring=2", resolve("flux.1-dev"), environ=env)
    with pytest.raises(UsageProblem, match=r"heads \(2\) to be a multiple of the Ulysses degree"):
        check_cp("ulysses=4", resolve("tiny-flux"), environ=env)
    with pytest.raises(UsageProblem, match="CogVideoX.*scaled_dot_product_attention directly"):
        check_cp("ulysses=2,ring=2", resolve("cogvideox-5b"), environ=env)
    with pytest.raises(UsageProblem, match="Mochi"):
        check_cp("ulysses=2,ring=2", resolve("mochi-1"), environ=env)
    with pytest.raises(UsageProblem, match="SD3"):
        check_cp("ulysses=2,ring=2", resolve("sd3.5-large"), environ=env)
    with pytest.raises(UsageProblem, match="offload"):
        check_cp("ring=4", resolve("flux.1-dev"), offload="model", environ=env)
