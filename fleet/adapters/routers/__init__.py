"""Traffic routers behind one interface (base.py): nginx (local and static clusters), Gateway
API HTTPRoute and Istio VirtualService (Kubernetes clusters). Plain Python, no Django."""
