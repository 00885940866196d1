"""Text for language models: tokenizers, corpora, the tokenized cache and each step's batch.

``settings.py`` is the ``data:`` section; ``tokenizer.py`` the three tokenizers (byte-level, a
``tokenizer.json``, a BPE trained on the corpus); ``sources.py`` reads documents (text files, JSON
Lines, the default corpus) or pre-tokenized files; ``cache.py`` tokenizes once into memory-mapped
token files keyed by what went in; ``corpus.py`` cuts batches from them, each a pure function of
(seed, step).
"""
