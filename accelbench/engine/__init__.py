"""The engine: executors that own a training step, and the runner that times them."""
