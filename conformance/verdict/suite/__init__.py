"""The pytest module the plugin collects; not meant to be run on its own."""
