"""The verdict side, in pytest's own process: the plugin (options, collection, the summary), the reports and
the claim reference. It never imports torch, numpy, Energon or the target: the targets run in supervised
processes (:mod:`~primus_energon.conformance.processes`)."""
