"""The report page's NIC section: per node, its named NICs (`status.nics`: failing,
recovering, warning; their PCI function, netdevs, checks, whether their DRA devices are
tainted), with the validation's NIC counts and whether device taints are in force."""

from __future__ import annotations

from collections import defaultdict

from netval.cli.report_html_format import escape
from netval.model.nic_status import DeviceTaints, NicEntry
from netval.model.status import NetworkValidationStatus


def nics_section(status: NetworkValidationStatus) -> str:
    nics = status.nics
    if nics is None:
        return ""
    head = (
        f"<p>{nics.total} NIC(s) reported by fresh nodes: {nics.failing} failing, "
        f"{nics.warning} warning.</p>"
    )
    if nics.device_taints is DeviceTaints.ACTIVE:
        head += (
            f"<p>Device taints in force: {nics.tainted} NIC(s) tainted as DRA devices, "
            f"{nics.nodes_degraded} node(s) degraded (their other NICs serve).</p>"
        )
    elif nics.device_taints is DeviceTaints.UNAVAILABLE:
        head += f"<p><strong>Device taints unavailable</strong>: {escape(nics.message)}</p>"
    by_node: dict[str, list[NicEntry]] = defaultdict(list)
    for entry in nics.entries:
        by_node[entry.node].append(entry)
    rows = "".join(
        f"<tr><td class='nw'>{escape(node)}</td><td class='nw'>{escape(e.device)}</td>"
        f"<td class='nw'>{escape(e.pci_address or '-')}</td>"
        f"<td class='nw'>{escape(', '.join(e.netdevs) or '-')}</td>"
        f"<td class='nw'>{escape(e.state.value)}</td>"
        f"<td>{escape(', '.join(e.checks) or '-')}</td>"
        f"<td class='nw'>{'yes' if e.tainted else 'no'}</td></tr>"
        for node, entries in sorted(by_node.items())
        for e in entries
    )
    table = (
        "<div class='scroll'><table><caption>NICs by node (failing, then recovering, then "
        "warning)</caption><thead><tr><th scope='col'>node</th><th scope='col'>RDMA device"
        "</th><th scope='col'>PCI</th><th scope='col'>netdevs</th><th scope='col'>state</th>"
        "<th scope='col'>checks</th><th scope='col'>device tainted</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
        if rows
        else "<p>No NIC fails or warns.</p>"
    )
    return f'<section id="nics"><h2>NICs</h2>{head}{table}</section>'


__all__ = ["nics_section"]
