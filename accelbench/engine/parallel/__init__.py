"""Tensor, pipeline and composed parallelism: the ``tp``, ``pp`` and ``mesh`` strategies.

``mesh`` lays the job's ranks out on a device mesh (axes dp, tp, pp; placement), ``tp`` applies Megatron-style tensor
parallelism to the workload's units with DTensor, ``pp`` cuts the model into pipeline stages run by
``torch.distributed.pipelining``, and ``executor`` composes them into the executor the runner trains through. The
analytical model (bubble, communication, memory, Megatron's FLOPs) the record and ``estimate`` use is
:mod:`accelbench.estimate.parallel`: pure arithmetic, which ``compare`` and ``report`` can import without the engine.
"""
