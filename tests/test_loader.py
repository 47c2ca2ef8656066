"""levers.loader: workload specs, --set parsing, and every error a user can meet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from levers import Workload
from levers.errors import FactoryError, LeversError, MissingDependency, WorkloadNotFound
from levers.loader import load_workload, parse_set
from levers.workloads import BUILTINS

FIXTURES = Path(__file__).parent / "fixtures"
BAD = f"{FIXTURES / 'bad_factories.py'}"


# --set parsing -----------------------------------------------------------------------------


def test_parse_set_literals_and_strings():
    params = parse_set(
        [
            "batch_size=4",
            "lr=1e-3",
            "flag=True",
            "nothing=None",
            "size=1b",
            "fixed=all",
            "fixed_list=suffix_attn,norm",
            "device=cuda",
            "quoted='x y'",
            "shape=[2, 3]",
            "expr=a=b",
            "empty=''",
        ]
    )
    assert params == {
        "batch_size": 4,
        "lr": 0.001,
        "flag": True,
        "nothing": None,
        "size": "1b",
        "fixed": "all",
        "fixed_list": "suffix_attn,norm",
        "device": "cuda",
        "quoted": "x y",
        "shape": [2, 3],
        "expr": "a=b",
        "empty": "",
    }
    assert type(params["batch_size"]) is int


def test_parse_set_refuses_an_item_without_a_value():
    # `--set hidden=` is a slip more often than an empty string, which reads as hidden=''
    with pytest.raises(LeversError, match="--set hidden= gives no value"):
        parse_set(["hidden="])


def test_parse_set_later_item_wins():
    assert parse_set(["a=1", "a=2"]) == {"a": 2}


def test_parse_set_empty():
    assert parse_set([]) == {}
    assert parse_set(None) == {}


@pytest.mark.parametrize("item", ["batch_size", "=4", "two words=1", "1x=2"])
def test_parse_set_malformed(item):
    with pytest.raises(LeversError) as info:
        parse_set([item])
    message = str(info.value)
    assert "key=value" in message
    assert repr(item.partition("=")[0].strip()) in message or repr(item) in message


# file form ---------------------------------------------------------------------------------


def test_file_factory_with_params_and_sibling_import():
    before = list(sys.path)
    workload = load_workload(
        f"{FIXTURES / 'my_workload.py'}:factory", {"hidden": 16, "batch_size": 8}
    )
    assert isinstance(workload, Workload)
    assert workload.name == "my_workload"
    assert workload.params == {"hidden": 16, "batch_size": 8}
    assert workload.tokens_per_step == 8
    assert workload.model.fc1.in_features == 16
    assert sys.path == before  # the file's directory was only there while loading
    workload.step()


def test_relative_file_path(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)
    workload = load_workload("fixtures/my_workload.py:factory", {})
    assert workload.model.fc1.in_features == 8


def test_file_default_factory_named_workload():
    workload = load_workload(str(FIXTURES / "default_factory.py"), {"hidden": 3})
    assert workload.model.in_features == 3
    # name and params are filled in from the spec when the factory leaves them at defaults
    assert workload.name == f"{FIXTURES / 'default_factory.py'}:workload"
    assert workload.params == {"hidden": 3}


def test_file_without_default_factory_lists_candidates():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload(BAD, {})
    message = str(info.value)
    assert "no function named 'workload'" in message
    assert ":FACTORY" in message
    # public functions defined in the file; private helpers and imports (Workload) are not listed
    assert "bad_model, empty_step, needs_dependency, raises, returns_dict, step_raises, strict" in (
        message
    )
    assert "_tiny_model" not in message
    assert "Workload" not in message.split("Functions defined there:")[1]


def test_missing_file():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("no/such/train.py:factory", {})
    message = str(info.value)
    assert "'no/such/train.py' does not exist" in message
    assert "relative to the current directory" in message


def test_missing_attribute_lists_candidates():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload(f"{FIXTURES / 'my_workload.py'}:make", {})
    message = str(info.value)
    assert "has no attribute 'make'" in message
    assert "Functions defined there: factory" in message


def test_not_callable():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:NOT_CALLABLE", {})
    assert "'NOT_CALLABLE'" in str(info.value)
    assert "is a int, not a callable" in str(info.value)


def test_factory_raises_keeps_user_frames_only():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:raises", {})
    error = info.value
    assert "raised RuntimeError: vocabulary file vocab.txt is empty" in str(error)
    tb = error.user_traceback
    assert tb.startswith("Traceback (most recent call last")
    assert "bad_factories.py" in tb
    assert "in raises" in tb and "in _load_vocab" in tb
    assert tb.rstrip().endswith("RuntimeError: vocabulary file vocab.txt is empty")
    assert "loader.py" not in tb  # levers' own frames are stripped


def test_factory_rejects_keyword_lists_parameters():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:strict", {"width": 2, "colour": "red"})
    message = str(info.value)
    assert "does not accept these parameters" in message
    assert "colour" in message
    assert "It accepts: width (required), depth=2" in message


def test_factory_missing_required_parameter():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:strict", {})
    assert "width" in str(info.value)
    assert "It accepts: width (required), depth=2" in str(info.value)


def test_factory_returns_non_workload():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:returns_dict", {})
    message = str(info.value)
    assert "returned dict, not a levers.Workload" in message
    assert "levers.Workload(model=..., step=..." in message


def test_invalid_workload_fields_show_user_line():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{BAD}:bad_model", {})
    assert "Workload.model must be a torch.nn.Module, got str" in str(info.value)
    assert "in bad_model" in info.value.user_traceback
    assert "workload.py" not in info.value.user_traceback  # levers.Workload's own frame


def test_missing_dependency_from_factory_passes_through():
    with pytest.raises(MissingDependency) as info:
        load_workload(f"{BAD}:needs_dependency", {})
    assert str(info.value) == "this workload needs flash_attn; pip install flash-attn"
    assert type(info.value) is MissingDependency


def test_file_importing_missing_package_names_it():
    with pytest.raises(MissingDependency) as info:
        load_workload(f"{FIXTURES / 'missing_dependency.py'}:factory", {})
    message = str(info.value)
    assert "needs the module 'levers_fixture_not_installed'" in message
    assert "pip install levers_fixture_not_installed" in message
    assert "missing_dependency.py" in info.value.user_traceback


def test_file_that_raises_on_import():
    with pytest.raises(FactoryError) as info:
        load_workload(f"{FIXTURES / 'import_raises.py'}:factory", {})
    assert "raised KeyError: 'hiden'" in str(info.value)
    assert 'HIDDEN = CONFIG["hiden"]' in info.value.user_traceback
    assert "<frozen importlib" not in info.value.user_traceback
    # a failed import leaves no half-initialised module behind
    assert not [m for m in sys.modules if m.startswith("levers_user_import_raises_")]


def test_same_stem_in_two_directories_are_distinct(tmp_path):
    for sub, hidden in (("a", 2), ("b", 3)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "train.py").write_text(
            "import torch\nfrom levers import Workload\n"
            f"def workload():\n    return Workload(model=torch.nn.Linear({hidden}, 1), step=lambda: None)\n"
        )
    a = load_workload(str(tmp_path / "a" / "train.py"), {})
    b = load_workload(str(tmp_path / "b" / "train.py"), {})
    assert (a.model.in_features, b.model.in_features) == (2, 3)


# module form -------------------------------------------------------------------------------


def test_module_form(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    workload = load_workload("fixture_pkg.workloads:linear", {"hidden": 5, "name": "lin"})
    assert workload.name == "lin"
    assert workload.model.in_features == 5
    assert workload.params == {"hidden": 5, "name": "lin"}


def test_module_not_found():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("levers_no_such_pkg.train:factory", {})
    message = str(info.value)
    assert "cannot import module 'levers_no_such_pkg.train'" in message
    assert "no module named 'levers_no_such_pkg'" in message
    assert "PYTHONPATH" in message


def test_submodule_not_found(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("fixture_pkg.nope:factory", {})
    assert "no module named 'fixture_pkg.nope'" in str(info.value)


def test_module_with_missing_dependency_inside(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(MissingDependency) as info:
        load_workload("fixture_pkg.needs_missing:factory", {})
    message = str(info.value)
    assert "needs the module 'levers_fixture_not_installed_either'" in message
    assert "fixture_pkg.needs_missing" in message


def test_module_missing_attribute(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("fixture_pkg.workloads:lnear", {})
    assert "has no attribute 'lnear'" in str(info.value)
    assert "Functions defined there: linear" in str(info.value)


# built-ins ---------------------------------------------------------------------------------


def test_unknown_builtin_suggests_close_match():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("lama", {})
    message = str(info.value)
    assert "unknown workload 'lama'" in message
    assert "Did you mean 'llama'?" in message
    assert f"built-in name ({', '.join(sorted(BUILTINS))})" in message
    assert "path/to/file.py:factory" in message
    assert "package.module:factory" in message


def test_unknown_builtin_without_close_match():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("zzzzzz", {})
    assert "Did you mean" not in str(info.value)


def test_module_without_factory_hints_at_colon_form():
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("levers.workloads", {})
    assert "write levers.workloads:FACTORY" in str(info.value)


def test_builtin_rejects_unknown_parameter():
    with pytest.raises(FactoryError) as info:
        load_workload("demo", {"levers_no_such_param": 1})
    message = str(info.value)
    assert "workload 'demo' does not accept these parameters" in message
    assert "size=" in message  # lists the accepted parameters, size among them


def test_builtin_demo_loads():
    workload = load_workload("demo", {})
    assert isinstance(workload, Workload)
    assert workload.name.startswith("demo")  # the factory names it (demo-tiny)


def test_module_form_finds_modules_in_current_directory(monkeypatch):
    monkeypatch.chdir(FIXTURES)
    before = list(sys.path)
    workload = load_workload("fixture_pkg.workloads:linear", {})
    assert workload.model.in_features == 4
    assert sys.path == before


def test_builtin_module_missing(monkeypatch):
    monkeypatch.setitem(BUILTINS, "gone", "levers.workloads.levers_no_such_module:build")
    with pytest.raises(WorkloadNotFound) as info:
        load_workload("gone", {})
    assert str(info.value) == (
        "the built-in workload 'gone' is missing from this installation of levers "
        "(no module levers.workloads.levers_no_such_module); reinstall levers"
    )


def test_builtin_rejects_bad_value_without_traceback():
    with pytest.raises(FactoryError) as info:
        load_workload("demo", {"size": "huge"})
    assert str(info.value).startswith("workload 'demo': size='huge' is not supported; use one of:")
    assert info.value.user_traceback is None


def test_a_file_without_the_factory_is_refused_without_running_its_module_level(tmp_path):
    # a script that trains at module level: importing it would run its whole training
    script = tmp_path / "plain_train.py"
    ran = tmp_path / "ran"
    script.write_text(
        "import pathlib\n"
        "def helper():\n    pass\n"
        f"pathlib.Path({str(ran)!r}).write_text('trained')\n"
    )
    for spec in (str(script), f"{script}:factory"):
        with pytest.raises(WorkloadNotFound) as info:
            load_workload(spec, {})
        message = str(info.value)
        assert "did not import it" in message
        assert f"levers audit -- python {script}" in message
        assert "README.md, section Workloads" in message and "levers.apply(model" in message
        assert "Functions defined there: helper" in message
    assert not ran.exists()


def test_a_factory_bound_under_a_top_level_if_or_by_import_is_found(tmp_path):
    source = tmp_path / "src_mod.py"
    source.write_text("def build():\n    return None\n")
    conditional = tmp_path / "conditional.py"
    conditional.write_text(
        "import sys\nif sys.platform:\n    def workload():\n        return 1\n"
        "from src_mod import build as factory\n"
    )
    from levers.loader import resolve_factory

    assert callable(resolve_factory(str(conditional)))
    assert callable(resolve_factory(f"{conditional}:factory"))
