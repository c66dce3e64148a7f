"""What leaves or enters a run: reading `.ckpt` files and sharded folders (`checkpoint_io`, the one
checkpoint reader), a run's folder as seen from outside (`run_folder`), Hugging
Face folders (`hf/`, `export`), scoring a policy (`evaluation`) and recording it (`video`).

May import: `core`, `envs`, `nets`, `algos`, `data`.
"""
