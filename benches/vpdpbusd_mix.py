"""Which operations share the pipes of 512-bit ``vpdpbusd`` (x86-64 with
AVX-512 VNNI; needs ``cc``): a loop of 24 independent ``vpdpbusd`` (12
chains) alone and with 3 or 6 other operations added, each variant's
nanoseconds per iteration and ``vpdpbusd`` per second. An added operation
that lengthens the loop takes a ``vpdpbusd`` slot.

    flock /work/wt/cpu1.lock taskset -c 1 python benches/vpdpbusd_mix.py
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def _dp(n: int) -> list[str]:
    return [f"vpdpbusd %zmm30, %zmm31, %zmm{i % 12}" for i in range(n)]


#: name -> the instructions of one iteration (AT&T syntax).
VARIANTS: dict[str, list[str]] = {
    "24 vpdpbusd": _dp(24),
    "+3 vmulps": _dp(24) + [f"vmulps %zmm29, %zmm28, %zmm{12 + i}" for i in range(3)],
    "+3 vfmadd231ps": _dp(24) + [f"vfmadd231ps %zmm29, %zmm28, %zmm{12 + i}" for i in range(3)],
    "+3 vcvtdq2ps": _dp(24) + [f"vcvtdq2ps %zmm29, %zmm{12 + i}" for i in range(3)],
    "+6 vpandd": _dp(24) + [f"vpandd %zmm29, %zmm28, %zmm{12 + i}" for i in range(6)],
    "+6 vpbroadcastd m32": _dp(24) + [f"vpbroadcastd 4(%rsp), %zmm{12 + i}" for i in range(6)],
}

MAIN = r"""
#include <stdio.h>
#include <time.h>
%(decls)s
static double cpu(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9; }
int main(void) {
  const long it = 20000000;
  struct { const char *name; void (*f)(long); } v[] = { %(table)s };
  for (unsigned i = 0; i < sizeof v / sizeof v[0]; i++) {
    v[i].f(it / 10);
    double t = cpu(); v[i].f(it); t = cpu() - t;
    printf("%%-20s %%.3f ns/iteration  %%.2f G vpdpbusd/s\n", v[i].name, t / it * 1e9,
           24.0 * it / t / 1e9);
  }
  return 0;
}
"""


def main() -> None:
    asm = [".text"]
    for i, body in enumerate(VARIANTS.values()):
        asm += [f".globl loop{i}", f"loop{i}:", "1:", *body, "dec %rdi", "jnz 1b", "ret"]
    asm.append('.section .note.GNU-stack,"",@progbits')
    decls = "".join(f"void loop{i}(long);\n" for i in range(len(VARIANTS)))
    table = ", ".join(f'{{"{name}", loop{i}}}' for i, name in enumerate(VARIANTS))
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "loops.S").write_text("\n".join(asm) + "\n")
        (Path(d) / "main.c").write_text(MAIN % {"decls": decls, "table": table})
        exe = str(Path(d) / "mix")
        subprocess.run(["cc", "-O2", "-o", exe, f"{d}/main.c", f"{d}/loops.S"], check=True)
        subprocess.run([exe], check=True)


if __name__ == "__main__":
    main()
