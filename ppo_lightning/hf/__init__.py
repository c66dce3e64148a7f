"""Files copied next to the weights by ``ppo-lightning export-hf`` (Hugging Face remote code).

They are templates, not imported by ppo_lightning itself: transformers imports them from the
exported folder when ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` is called.
"""
