"""Signal processing: DFT and STFT (complex values as a trailing [re, im] axis), the Hann, Hamming
and Blackman windows, and MelWeightMatrix."""
from __future__ import annotations

import math

import torch

from ..dtypes import onnx_to_torch
from ..errors import OnnxGradError, UnsupportedOpError
from ..registry import describe, register
from .shape import int_scalar


def _complex(x):
    """(..., 1) real or (..., 2) [re, im] -> a real or complex tensor without the trailing axis."""
    if x.shape[-1] == 1:
        return x[..., 0]
    if x.shape[-1] != 2:
        raise OnnxGradError(f"DFT: the last axis must hold 1 (real) or 2 (re, im) values, got {x.shape[-1]}")
    return torch.complex(x[..., 0], x[..., 1])


def _dft(x, length, axis, inverse, onesided):
    rank = x.dim()
    axis = axis % rank
    if axis == rank - 1:
        raise OnnxGradError("DFT: axis must be a signal axis, not the trailing [re, im] axis")
    # Transforms run in float64: a float32 FFT's rounding noise is larger than the tolerances
    # ONNX's cases (computed by numpy in float64) hold near-zero components to.
    signal = _complex(x.to(torch.promote_types(x.dtype, torch.float64)))
    if length is None:
        length = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if length < 1:
        raise OnnxGradError(f"DFT: the transform along axis {axis} (of size {x.shape[axis]}) has length {length}"
                            f"{' (a onesided inverse: 2 × (size − 1))' if inverse and onesided else ''}")
    if inverse:
        if onesided:
            return torch.fft.irfft(signal, n=length, dim=axis).unsqueeze(-1)
        out = torch.fft.ifft(signal, n=length, dim=axis)
    elif onesided and not signal.is_complex():
        out = torch.fft.rfft(signal, n=length, dim=axis)
    else:
        out = torch.fft.fft(signal, n=length, dim=axis)
        if onesided:
            out = out.narrow(axis, 0, length // 2 + 1)
    if not out.is_complex():
        out = torch.complex(out, torch.zeros_like(out))
    return torch.view_as_real(out.resolve_conj()).to(x.dtype)  # ifft of a real signal is a lazy conjugate


def _length(dft_length):
    return None if dft_length is None else int_scalar(dft_length)


@register("DFT", since=17, until=19)
def dft_17(x, dft_length=None, *, axis=1, inverse=0, onesided=0):
    return _dft(x, _length(dft_length), axis, inverse, onesided)


@describe("DFT", needs="", rule=("dinput = the adjoint DFT of dY   # inverse={inverse}, onesided={onesided}", None, None))
@register("DFT", since=20)
def dft(x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    return _dft(x, _length(dft_length), -2 if axis is None else int_scalar(axis), inverse, onesided)


@describe("STFT", needs="in0,in2",
          rule=("dsignal = the overlap-add of each frame's adjoint DFT of dY, times the window",
                None,
                "dwindow = Σ over the frames of the frame times the adjoint DFT of dY",
                None))
@register("STFT", since=17)
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    step = int_scalar(frame_step)
    if frame_length is not None:
        size = int_scalar(frame_length)
    elif window is not None:
        size = window.shape[0]
    else:
        raise OnnxGradError("STFT needs a window or a frame_length")
    if window is not None and window.shape[0] != size:
        raise OnnxGradError(f"STFT: window length {window.shape[0]} differs from frame_length {size}")
    if signal.dim() != 3 or signal.shape[1] < size:
        raise OnnxGradError(f"STFT: signal {list(signal.shape)} must be (batch, length >= {size}, 1 or 2)")
    frames = signal.unfold(1, size, step).transpose(-1, -2)  # (batch, frames, size, 1 or 2)
    if window is not None:
        frames = frames * window.to(signal.dtype).reshape(size, 1)
    return _dft(frames, size, 2, 0, onesided and signal.shape[-1] == 1)


def _window(size, periodic, output_datatype, float_dtype, terms):
    n = int_scalar(size)
    dtype = onnx_to_torch(output_datatype)
    if dtype.is_floating_point and float_dtype is not None:
        dtype = float_dtype
    denom = n if periodic else n - 1
    k = torch.arange(n, dtype=torch.float64)
    phase = 2 * math.pi * k / denom
    w = sum(c * torch.cos(m * phase) for m, c in enumerate(terms))
    return w.to(dtype)


@describe("HannWindow", no_gradient="it depends only on the integer size")
@register("HannWindow", since=17)
def hann_window(size, *, output_datatype=1, periodic=1, float_dtype=None):
    return _window(size, periodic, output_datatype, float_dtype, (0.5, -0.5))


@describe("HammingWindow", no_gradient="it depends only on the integer size")
@register("HammingWindow", since=17)
def hamming_window(size, *, output_datatype=1, periodic=1, float_dtype=None):
    return _window(size, periodic, output_datatype, float_dtype, (25.0 / 46.0, -21.0 / 46.0))


@describe("BlackmanWindow", no_gradient="it depends only on the integer size")
@register("BlackmanWindow", since=17)
def blackman_window(size, *, output_datatype=1, periodic=1, float_dtype=None):
    return _window(size, periodic, output_datatype, float_dtype, (0.42, -0.5, 0.08))


def _mel(hz):
    return 2595.0 * torch.log10(1.0 + hz / 700.0)


@describe("MelWeightMatrix", no_gradient="piecewise constant in the edge frequencies (the bins are integers)")
@register("MelWeightMatrix", since=17)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                      output_datatype=1, float_dtype=None):
    # NOTE: the bins are integers computed from the edge frequencies, so the matrix is piecewise
    # constant in them: nothing flows back.
    mels, length, rate = int_scalar(num_mel_bins), int_scalar(dft_length), int_scalar(sample_rate)
    low = _mel(lower_edge_hertz.detach().to(torch.float64).reshape(()))
    high = _mel(upper_edge_hertz.detach().to(torch.float64).reshape(()))
    steps = torch.arange(mels + 2, dtype=torch.float64, device=low.device)
    hz = 700.0 * torch.expm1((steps * ((high - low) / (mels + 2)) + low) / 2595.0 * math.log(10))
    bins = torch.floor((length + 1) * hz / rate).to(torch.int64)
    left, center, right = bins[:-2], bins[1:-1], bins[2:]
    j = torch.arange(length // 2 + 1, device=low.device).reshape(-1, 1)
    rise = torch.where(center > left, (j - left) / (center - left).clamp(min=1), (j == center).to(torch.float64))
    fall = (right - j) / (right - center).clamp(min=1)
    out = torch.where((j >= left) & (j <= center), rise, torch.zeros((), dtype=torch.float64))
    out = torch.where((j >= center) & (j < right) & (right > center), fall, out)
    dtype = onnx_to_torch(output_datatype)
    if dtype.is_floating_point and float_dtype is not None:
        dtype = float_dtype
    if not dtype.is_floating_point and not dtype.is_complex:
        raise UnsupportedOpError("MelWeightMatrix: output_datatype must be a float type")
    return out.to(dtype)
