"""Reading recorded runs: what-if replay with other settings (``replay``), per-run metrics
(``metrics``), A/B comparison of settings (``compare``) and the outside judge (``judge``)."""
