"""Hugging Face folders: `writer` (``export-hf``), `loader` (``load_pretrained``), `card` (the model
card), `bundle` (the folder's self-contained network code). ``remote/`` holds the configuration and
modeling templates copied next to the weights for ``AutoModel.from_pretrained(...,
trust_remote_code=True)``; ppo_lightning never imports them.
"""
