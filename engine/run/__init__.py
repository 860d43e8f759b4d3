"""Running a graph on torch: the plan (a flat list of steps over integer slots), its fx twin, the
fusions and lean steps it may use, values converted to tensors, and pause points for a front end.
"""
