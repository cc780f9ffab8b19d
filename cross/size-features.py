#!/usr/bin/env python3
"""Attribute an unstripped binary's symbols (nm -C -S) to bramble's features:
a symbol goes to a feature when its demangled name (generics included) names
one of that feature's modules or crates and no other feature's.
usage: cross/size-features.py UNSTRIPPED_BINARY (docs/bench-log.md, "Where the megabytes are")"""
import subprocess, sys, re, collections
F = {
 'email': ['bramble::channels::email','bramble::clients::imap','bramble::clients::smtp','lettre::','mail_parser::','email_encoding::','email_address::','quoted_printable::','hashify::'],
 'matrix': ['bramble::channels::matrix','bramble::clients::matrix'],
 'discord': ['bramble::channels::discord','bramble::clients::discord'],
 'signal': ['bramble::channels::signal','bramble::clients::signal'],
 'feishu': ['bramble::channels::feishu','bramble::clients::feishu'],
 'ntfy': ['bramble::channels::ntfy','bramble::clients::ntfy'],
 'webhook': ['bramble::channels::webhook','bramble::clients::webhook','httpdate::','hyper::server','hyper::proto::h1::role::Server','hyper_util::server','http_body_util::'],
 'fleet': ['bramble::fleet'],
 'mcp': ['bramble::tools::mcp','bramble::cli::mcp'],
 'homeassistant': ['bramble::channels::homeassistant','bramble::clients::ha_rest','bramble::tools::homeassistant'],
 'web-search': ['bramble::tools::search','htmd::','html5ever::','markup5ever','string_cache::','tendril::','web_atoms::','xml5ever::','phf::','phf_shared::'],
 'line-editor': ['rustyline::','unicode_segmentation::','utf8parse::'],
 'telegram-media': ['bramble::channels::telegram::media'],
}
out = subprocess.run(['nm','-C','-S','--size-sort',sys.argv[1]],capture_output=True,text=True).stdout
tot = collections.Counter(); shared = 0
for l in out.splitlines():
    p = l.split(' ',3)
    if len(p) < 4: continue
    s = int(p[1],16); name = p[3]
    hits = [f for f,pats in F.items() if any(x in name for x in pats)]
    if len(hits) == 1: tot[hits[0]] += s
    elif len(hits) > 1: shared += s
for f,v in tot.most_common(): print(f'{v:10,d}  {f}')
print(f'{shared:10,d}  (named by two features)')
