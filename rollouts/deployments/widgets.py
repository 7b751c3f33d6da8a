"""Widgets of the deployment form: the servers' checkboxes name each server's cluster, so the
page shows only those of the cluster chosen (``static/switchyard/console.js``)."""

from __future__ import annotations

from typing import Any

from django import forms


class ServerCheckboxes(forms.CheckboxSelectMultiple):
    """One checkbox per server, each with ``data-cluster`` (its cluster's id) and the form's
    ``data-follows`` (the name of the field that picks the cluster)."""

    def create_option(self, name: str, value: Any, label: Any, selected: Any, index: int,
                      subindex: int | None = None, attrs: dict[str, Any] | None = None
                      ) -> dict[str, Any]:
        option = super().create_option(name, value, label, selected, index, subindex, attrs)
        server = getattr(value, "instance", None)
        if server is not None:
            option["attrs"]["data-cluster"] = str(server.cluster_id)
            option["attrs"]["data-follows"] = "cluster"
        return option
