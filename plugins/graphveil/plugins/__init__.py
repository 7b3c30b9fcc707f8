"""Built-in GraphVeil plugins, one package per method. Each registers through the
``graphveil`` entry-point group, the same path a third-party plugin uses."""
