"""Factories for `python3 -m mutwo verify` on the GPU benchmark's
models: each returns (eager model, batch function), the batch function
giving make_models.batch_of's synthetic inputs and targets.

    python3 -m mutwo verify bench/gpu/verify_models.py:resnet152 \
        --schedule S.json --device cuda:0 --optimizer adam
"""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_models import batch_of, build  # noqa: E402


def _factory(name):
    return build(name), functools.partial(batch_of, name)


def resnet152():
    return _factory("resnet152")


def transformer():
    return _factory("transformer")


def gpt():
    return _factory("gpt")


def vit_b_16():
    return _factory("vit_b_16")
