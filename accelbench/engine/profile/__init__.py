"""Where a step's time goes (``accelbench run --profile``): a profiled window of steady-state steps, run after the
timed epochs so that profiling never changes a measured epoch, split the way seed 001 splits an iteration.

Where things are:

- :mod:`.analysis`: the step analysis of the profiler's events: the categories a step's time is split into (their
  definitions), :func:`analyse_step` for one step, :func:`analyse_events` for a profiler's steps, :func:`summarise`.
- :mod:`.capture`: running torch.profiler over training steps (:func:`profile_steps`): the window cut to the memory
  that can hold it, the Chrome trace written beside the record, Kineto's chatter kept out of the user's output,
  and the record's ``profile`` from the analysed steps (:func:`step_profile`).
- :mod:`.hta`: the device's own timeline on CUDA and ROCm by Holistic Trace Analysis (the ``hta`` extra), with
  HTA's definitions: :func:`hta_device_timeline`.
"""

from accelbench.engine.profile.analysis import (
    CATEGORIES,
    DATA_REGION,
    Event,
    Segment,
    StepAnalysis,
    analyse_events,
    analyse_step,
    is_communication,
    summarise,
)
from accelbench.engine.profile.capture import (
    MAX_PROFILE_STEPS,
    MIN_EVENTS_PER_STEP,
    PROFILE_BYTES_PER_EVENT,
    PROFILE_MEMORY_SHARE,
    PROFILE_WARMUP_STEPS,
    profile_steps,
    profile_steps_that_fit,
    step_profile,
)
from accelbench.engine.profile.hta import HTA_HINT, hta_device_timeline

__all__ = [
    "CATEGORIES",
    "DATA_REGION",
    "HTA_HINT",
    "MAX_PROFILE_STEPS",
    "MIN_EVENTS_PER_STEP",
    "PROFILE_BYTES_PER_EVENT",
    "PROFILE_MEMORY_SHARE",
    "PROFILE_WARMUP_STEPS",
    "Event",
    "Segment",
    "StepAnalysis",
    "analyse_events",
    "analyse_step",
    "hta_device_timeline",
    "is_communication",
    "profile_steps",
    "profile_steps_that_fit",
    "step_profile",
    "summarise",
]
