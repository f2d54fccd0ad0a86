"""The library's version and the spec's version, at the bottom of the package: cache files,
the spec JSON and the CLI read them without importing the package's front."""

__version__ = "0.1.0"
SPEC_VERSION = "1"  # changes when any byte a conforming implementation writes would change
