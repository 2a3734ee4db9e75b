"""Test fixture: importing this plugin fails, as a plugin with a missing
native dependency would."""
raise ImportError("gradcore_broken_fixture needs libnotthere.so, which is not installed")
