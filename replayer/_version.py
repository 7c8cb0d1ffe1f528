"""The package version, in a leaf: every layer stamps it into what it writes
(traces, run files, bundles) without importing the package facade."""

__version__ = "0.1.0"
