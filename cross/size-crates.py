#!/usr/bin/env python3
"""Per-crate / per-module size of an unstripped binary: nm -C --size-sort -S.
usage: cross/size-crates.py BINARY [--modules] [--top N] [--nm NM]"""
import subprocess, sys, re, collections
args = sys.argv[1:]
binp = args[0]
nm = 'nm'
if '--nm' in args: nm = args[args.index('--nm')+1]
top = int(args[args.index('--top')+1]) if '--top' in args else 40
out = subprocess.run([nm, '-C', '--size-sort', '-S', binp], capture_output=True, text=True).stdout
std = {'core','alloc','std','compiler_builtins','hashbrown','std_detect','rustc_demangle','addr2line','gimli','miniz_oxide','object','memchr_std'}
def crate_of(name):
    n = name
    # trait impls: <A as B>::f -> A ; drop_in_place<T> -> T
    for _ in range(6):
        m = re.match(r'^<(.*)$', n)
        if m:
            n = m.group(1)
            n = re.sub(r'^(&mut |&|\*const |\*mut |dyn |\[|\()+','',n)
            continue
        m = re.match(r'^core::ptr::drop_in_place<(.*)', n)
        if m:
            n = m.group(1); n = re.sub(r'^(&mut |&|\*const |\*mut |dyn |\[|\()+','',n); continue
        break
    m = re.match(r'^([A-Za-z_][A-Za-z0-9_]*)::', n)
    return m.group(1) if m else None, n
def module_of(n, depth=2):
    parts = re.split(r'::', re.split(r'[<> ]', n)[0])
    return '::'.join(parts[:depth])
crates = collections.Counter(); mods = collections.Counter(); funcs=[]
total_text = 0; unknown = 0
for line in out.splitlines():
    f = line.split(' ', 3)
    if len(f) < 4: continue
    addr, size, typ, name = f
    size = int(size, 16)
    if typ not in 'tTrRdDbB' : continue
    c, n = crate_of(name)
    if typ in 'tT': total_text += size
    key = c or ('?' + typ)
    crates[key] += size
    if c == 'bramble': mods[module_of(n, 3)] += size
    funcs.append((size, typ, name))
print('text total (symbols):', total_text)
for k, v in crates.most_common(top): print(f'{v:10,d}  {k}')
if '--modules' in args:
    print('--- bramble modules')
    for k, v in mods.most_common(top): print(f'{v:10,d}  {k}')
if '--funcs' in args:
    print('--- top symbols')
    for s,t,n in sorted(funcs, reverse=True)[:top]: print(f'{s:10,d} {t} {n[:200]}')
