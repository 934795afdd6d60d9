"""The pool review: one build (:mod:`.build`), its reads, its sections and their rendering."""
