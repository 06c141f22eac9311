"""Sphinx's settings for the series' site (tools/site/build.py stages the pages, then runs Sphinx
with this file). The notebooks are shown as committed: never executed for the site."""

project = "Profiling Distributed PyTorch"
author = "the Profiling Distributed PyTorch authors"
copyright = "2026, " + author

extensions = ["myst_nb", "sphinx_copybutton"]
root_doc = "index"
exclude_patterns = ["_build"]

# The notebooks' outputs are real runs that nbval checks: the site shows them as they are.
nb_execution_mode = "off"
nb_merge_streams = True
# Headings get GitHub's anchors, so that links such as GLOSSARY.md#rank work here as there.
myst_heading_anchors = 3

html_theme = "sphinx_book_theme"
html_title = project
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 1,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    # The notebooks need the repository to run: "Run it yourself" says how to get it.
    "use_download_button": False,
}
# Copy a code cell without the prompts or outputs.
copybutton_exclude = ".linenos, .gp, .go"
# Light or dark as the reader's system prefers (the theme logs an error when none is given).
html_context = {"default_mode": "auto"}
# Ranks side by side on a timeline: compute in blue, communication in vermillion.
html_favicon = "favicon.svg"
# The code boxes' font, small enough for the lessons' 88-character lines (static/code.css).
html_static_path = ["static"]
html_css_files = ["code.css"]
