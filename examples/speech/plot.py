"""A training-curve PNG without a plotting library: a small raster, a 5x7 font, zlib.

Two panels: training loss per epoch, and held-out WER at the evaluation epochs.
"""

import struct
import zlib

# 5x7 glyphs, one string of 7 rows of 5 bits each (1 = ink), for the characters the plot uses.
_FONT = {
    "0": "01110 10001 10011 10101 11001 10001 01110",
    "1": "00100 01100 00100 00100 00100 00100 01110",
    "2": "01110 10001 00001 00010 00100 01000 11111",
    "3": "11110 00001 00001 01110 00001 00001 11110",
    "4": "00010 00110 01010 10010 11111 00010 00010",
    "5": "11111 10000 11110 00001 00001 10001 01110",
    "6": "00110 01000 10000 11110 10001 10001 01110",
    "7": "11111 00001 00010 00100 01000 01000 01000",
    "8": "01110 10001 10001 01110 10001 10001 01110",
    "9": "01110 10001 10001 01111 00001 00010 01100",
    ".": "00000 00000 00000 00000 00000 01100 01100",
    "%": "11001 11010 00010 00100 01000 01011 10011",
    "-": "00000 00000 00000 11111 00000 00000 00000",
    " ": "00000 00000 00000 00000 00000 00000 00000",
    "A": "01110 10001 10001 11111 10001 10001 10001",
    "C": "01110 10001 10000 10000 10000 10001 01110",
    "D": "11110 10001 10001 10001 10001 10001 11110",
    "E": "11111 10000 10000 11110 10000 10000 11111",
    "G": "01110 10001 10000 10111 10001 10001 01111",
    "H": "10001 10001 10001 11111 10001 10001 10001",
    "I": "01110 00100 00100 00100 00100 00100 01110",
    "L": "10000 10000 10000 10000 10000 10000 11111",
    "N": "10001 11001 10101 10011 10001 10001 10001",
    "O": "01110 10001 10001 10001 10001 10001 01110",
    "P": "11110 10001 10001 11110 10000 10000 10000",
    "R": "11110 10001 10001 11110 10100 10010 10001",
    "S": "01111 10000 10000 01110 00001 00001 11110",
    "T": "11111 00100 00100 00100 00100 00100 00100",
    "U": "10001 10001 10001 10001 10001 10001 01110",
    "W": "10001 10001 10001 10101 10101 10101 01010",
}


class Canvas:
    def __init__(self, width, height, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = [bytearray(bytes(background) * width) for _ in range(height)]

    def set(self, x, y, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            self.pixels[y][3 * x:3 * x + 3] = bytes(color)

    def line(self, x0, y0, x1, y1, color, thickness=1):
        x0, y0, x1, y1 = (int(round(v)) for v in (x0, y0, x1, y1))
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            x = x0 + (x1 - x0) * i / steps
            y = y0 + (y1 - y0) * i / steps
            for dx in range(thickness):
                for dy in range(thickness):
                    self.set(int(round(x)) + dx - thickness // 2,
                             int(round(y)) + dy - thickness // 2, color)

    def text(self, x, y, string, color=(0, 0, 0), scale=2):
        for char in string.upper():
            rows = _FONT.get(char, _FONT[" "]).split()
            for row, bits in enumerate(rows):
                for col, bit in enumerate(bits):
                    if bit == "1":
                        for dx in range(scale):
                            for dy in range(scale):
                                self.set(x + col * scale + dx, y + row * scale + dy, color)
            x += 6 * scale

    def png(self):
        raw = b"".join(b"\x00" + bytes(row) for row in self.pixels)

        def chunk(kind, data):
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def _format(value, percent=False):
    if percent:
        return f"{100 * value:.0f}%"
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"


def _panel(canvas, left, top, width, height, title, points, color, percent=False):
    black, grey = (0, 0, 0), (220, 220, 220)
    canvas.text(left + width // 2 - 6 * len(title), top - 24, title)
    canvas.line(left, top, left, top + height, black)
    canvas.line(left, top + height, left + width, top + height, black)
    if not points:
        return
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_lo, x_hi = min(xs), max(max(xs), min(xs) + 1)
    y_lo, y_hi = min(0.0, min(ys)), max(ys)
    if y_hi <= y_lo:
        y_hi = y_lo + 1.0

    def to_px(x, y):
        return (left + (x - x_lo) / (x_hi - x_lo) * width,
                top + height - (y - y_lo) / (y_hi - y_lo) * height)

    for i in range(5):
        value = y_lo + (y_hi - y_lo) * i / 4
        _, py = to_px(x_lo, value)
        canvas.line(left + 1, py, left + width, py, grey)
        label = _format(value, percent)
        canvas.text(left - 8 - 12 * len(label), int(py) - 7, label)
    for value in (x_lo, (x_lo + x_hi) // 2, x_hi):
        px, _ = to_px(value, y_lo)
        canvas.line(px, top + height, px, top + height + 5, black)
        label = str(int(value))
        canvas.text(int(px) - 6 * len(label), top + height + 10, label)
    canvas.text(left + width // 2 - 30, top + height + 32, "EPOCH")
    previous = None
    for x, y in points:
        px, py = to_px(x, y)
        if previous is not None:
            canvas.line(previous[0], previous[1], px, py, color, thickness=2)
        canvas.line(px - 2, py, px + 2, py, color, thickness=3)
        previous = (px, py)


def write_training_curve(path, losses, wer_points):
    """Writes a PNG: loss per epoch (`losses`) and WER at `(epoch, wer)` points."""
    canvas = Canvas(1000, 420)
    loss_points = [(i + 1, float(v)) for i, v in enumerate(losses)]
    _panel(canvas, 110, 50, 340, 300, "TRAINING LOSS", loss_points, (31, 119, 180))
    _panel(canvas, 620, 50, 340, 300, "HELD-OUT WER", [(int(e), float(w)) for e, w in wer_points],
           (214, 39, 40), percent=True)
    with open(path, "wb") as f:
        f.write(canvas.png())
