"""The synthetic generator's compiled formatters: payment values as JSON and the trace
headers, written straight into Arrow buffers (Python string formatting would be half the
generator's time), apart from the drawing of records (`keyfill.synth.generate`)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from keygroups._numba import Int, njit

CURRENCIES = (b"EUR", b"USD", b"GBP", b"CHF")
HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
CURRENCY_BYTES = np.frombuffer(b"".join(CURRENCIES), np.uint8).reshape(len(CURRENCIES), 3)


@njit(cache=True)
def fill_headers(
    trace: np.ndarray,
    has_origin: np.ndarray,
    origin_null: np.ndarray,
    hexdigits: np.ndarray,
    key_off: np.ndarray,
    key_data: np.ndarray,
    val_off: np.ndarray,
    val_data: np.ndarray,
    val_valid: np.ndarray,
) -> None:
    """Header items: ("trace-id", 16 hex chars) and, where has_origin, ("source", "checkout" or null)."""
    trace_id = np.frombuffer(b"trace-id", np.uint8)
    source = np.frombuffer(b"source", np.uint8)
    checkout = np.frombuffer(b"checkout", np.uint8)
    j = kp = vp = 0
    for i in range(trace.shape[0]):
        key_off[j] = kp
        val_off[j] = vp
        key_data[kp : kp + 8] = trace_id
        kp += 8
        for b in range(8):
            val_data[vp] = hexdigits[trace[i, b] >> 4]
            val_data[vp + 1] = hexdigits[trace[i, b] & 15]
            vp += 2
        val_valid[j] = True
        j += 1
        if has_origin[i]:
            key_off[j] = kp
            val_off[j] = vp
            key_data[kp : kp + 6] = source
            kp += 6
            val_valid[j] = not origin_null[i]
            if val_valid[j]:
                val_data[vp : vp + 8] = checkout
                vp += 8
            j += 1
    key_off[j] = kp
    val_off[j] = vp


@njit(cache=True)
def _put_int(out: np.ndarray, pos: Int, v: Int) -> Int:
    """Decimal digits of a non-negative int (hand-written: numba has no str formatting)."""
    if v == 0:
        out[pos] = 48
        return pos + 1
    digits = 0
    t = v
    while t > 0:
        t //= 10
        digits += 1
    for i in range(digits - 1, -1, -1):
        out[pos + i] = 48 + v % 10
        v //= 10
    return pos + digits


@njit(cache=True)
def _put_text(out: np.ndarray, pos: Int, text: np.ndarray) -> Int:
    for b in text:
        out[pos] = b
        pos += 1
    return pos


@njit(cache=True)
def _payment_json_fill(
    out: np.ndarray,
    offsets: np.ndarray,
    key_bytes: np.ndarray,
    null: np.ndarray,
    cents: np.ndarray,
    merchant: np.ndarray,
    currency: np.ndarray,
    ts: np.ndarray,
    currencies: np.ndarray,
    p_user: np.ndarray,
    p_null: np.ndarray,
    p_amount: np.ndarray,
    p_merchant: np.ndarray,
    p_currency: np.ndarray,
    p_ts: np.ndarray,
    p_end: np.ndarray,
) -> Int:
    pos: Int = 0
    for i in range(null.shape[0]):
        offsets[i] = pos
        pos = _put_text(out, pos, p_user)
        if null[i]:
            pos = _put_text(out, pos, p_null)
        else:
            out[pos] = 34
            pos = _put_text(out, pos + 1, key_bytes[i])
            out[pos] = 34
            pos += 1
        pos = _put_text(out, pos, p_amount)
        pos = _put_int(out, pos, cents[i] // 100)
        out[pos] = 46
        out[pos + 1] = 48 + (cents[i] % 100) // 10
        out[pos + 2] = 48 + cents[i] % 10
        pos = _put_text(out, pos + 3, p_merchant)
        m = merchant[i]
        for d in range(4, -1, -1):
            out[pos + d] = 48 + m % 10
            m //= 10
        pos = _put_text(out, pos + 5, p_currency)
        pos = _put_text(out, pos, currencies[currency[i]])
        pos = _put_text(out, pos, p_ts)
        pos = _put_int(out, pos, ts[i])
        pos = _put_text(out, pos, p_end)
    offsets[null.shape[0]] = pos
    return pos


def payment_json(
    key_bytes: np.ndarray,
    null: np.ndarray,
    cents: np.ndarray,
    merchant: np.ndarray,
    currency: np.ndarray,
    ts: np.ndarray,
    currencies: np.ndarray,
) -> pa.Array:
    """Values as JSON payments, `{"user":..,"amount":..,"merchant":..,"currency":..,"ts":..}`,
    formatted by a compiled loop: Python string formatting would be half the generator's time."""
    n = len(null)
    out = np.empty(n * (key_bytes.shape[1] + 120), np.uint8)
    offsets = np.empty(n + 1, np.int32)
    parts = [
        np.frombuffer(t, np.uint8)
        for t in (b'{"user":', b"null", b',"amount":', b',"merchant":"m-', b'","currency":"', b'","ts":', b"}")
    ]
    end = _payment_json_fill(out, offsets, key_bytes, null, cents, merchant, currency, ts, currencies, *parts)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out[:end])])
