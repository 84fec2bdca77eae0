"""The core of the suite: claims and their results, profiles, declared transforms, target specs, the run's
options, and the breadcrumbs a running check leaves. Standard library only: the process that gives the
verdicts imports it without torch, numpy or Energon."""
