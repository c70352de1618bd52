"""The cluster test bed: a control plane plus nodes whose pods really run, on this machine.

``network``: the bed's network (a root-netns veth for the apiserver, a bed netns playing the nodes' host
network with a bridge for pods, one netns per pod), its id allocation and the cleanup of crashed beds.
The node agent (``tests.nodeagent``) builds pods on it. See docs/nodeagent.md.

This package is test infrastructure: nothing under ``operator/`` or ``trainer_image/`` may import it.
"""
