"""docs/modules.md is the tree's module map: generated from the modules' own docstrings, so a
module added, moved, renamed or re-described shows up as a difference here."""

from tools import module_map


def test_every_module_has_a_docstring_for_the_map():
    assert module_map.undocumented() == []


def test_the_doc_holds_the_map_of_the_tree():
    in_doc = module_map.section_in_doc(module_map.DOC.read_text())
    assert in_doc == module_map.module_map(), "run: python -m tools.module_map --write"


def test_the_first_sentence_is_what_a_row_shows():
    assert module_map.first_sentence("One line. More here.") == "One line."
    assert module_map.first_sentence("Uses e.g. this, learner.grad.x and ``a.b``. Then.") == \
        "Uses e.g. this, learner.grad.x and ``a.b``."
    assert module_map.first_sentence("No stop\nacross lines\n\nsecond") == "No stop across lines"
    assert module_map.first_sentence("a | b.") == "a \\| b."
