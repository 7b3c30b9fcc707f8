"""The relational task of papers 1 and 2 as a package: the task (:mod:`.task`, registered as
``relational`` by the ``standard`` plugin), its per-tuple losses (:mod:`.losses`) and its
evaluation protocols (:mod:`.few_shot`).

A library package, not a plugin: it registers nothing itself, so configs name the task as before
(``task: {name: relational}``).
"""
