from ppo_lightning.export import ExportError, load_pretrained  # noqa: F401
