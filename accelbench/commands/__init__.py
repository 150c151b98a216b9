"""The commands that are not a package of their own: ``run`` (:mod:`.run`), ``info``, ``plugins`` and ``schema``
(:mod:`.info`). ``compare``, ``report``, ``sweep``, ``estimate`` and ``comm`` live with what they do."""
