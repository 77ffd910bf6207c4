"""Built-in model names are checked before anything starts (learner/preflight.py), against
the same names the model registry builds (learner/models/loading.py)."""

from learner.config import ConfigError, parse_config
from learner.preflight import BUILTIN_MODELS, check_model_paths

import pytest


def test_the_preflight_names_are_the_registrys():
    from learner.models.loading import BUILTIN_RECIPES, LONG_CONTEXT

    assert set(BUILTIN_MODELS) == set(BUILTIN_RECIPES) | set(LONG_CONTEXT)


@pytest.mark.parametrize("field, model", [("model.policy", {"policy": "builtin:huge"}),
                                          ("model.teacher", {"teacher": "builtin:"})])
def test_an_unknown_builtin_name_is_one_line_naming_the_field(field, model):
    cfg = parse_config({"model": model, "algorithm": {"objective": "opd"}})
    with pytest.raises(ConfigError, match=f"^{field}: 'builtin:[a-z]*' is not a built-in model \\(builtin:tiny, "):
        check_model_paths(cfg)
