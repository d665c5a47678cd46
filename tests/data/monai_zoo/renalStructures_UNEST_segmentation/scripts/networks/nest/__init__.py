#!/usr/bin/env python3
from .utils import (
    Conv3dSame,
    DropPath,
    Linear,
    Mlp,
    _assert,
    conv3d_same,
    create_conv3d,
    create_pool3d,
    get_padding,
    get_same_padding,
    pad_same,
    to_ntuple,
    trunc_normal_,
)
