"""The `hal` command line: probe | profiles | select | bench | build."""
