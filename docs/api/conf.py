"""Sphinx configuration of the API reference: every public name of ``pcgroups``, from its docstring.

Built by ./scripts/test (``python -m sphinx -W -b html docs/api build/docs``): a warning is an error,
and so is a name of ``pcgroups.__all__`` that index.rst does not document.
"""

import sys
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout, when pcgroups is not installed

import pcgroups

project = "pcgroups"
version = release = pcgroups.__version__
extensions = ["sphinx.ext.autodoc"]
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": True}
default_role = "code"  # `x` in a docstring is code, as ``x`` is
html_theme = "alabaster"
html_title = f"pcgroups {release} API reference"
exclude_patterns: list[str] = []


def _check_complete(app: Sphinx, env: BuildEnvironment) -> None:
    """Every public name is documented, under ``pcgroups.<name>``."""
    documented = {name for name, *_ in env.get_domain("py").get_objects()}
    missing = [name for name in pcgroups.__all__ if f"pcgroups.{name}" not in documented]
    if missing:
        logging.getLogger(__name__).warning("public names missing from the API reference: %s", ", ".join(missing))


def setup(app: Sphinx) -> None:
    app.connect("env-check-consistency", _check_complete)
