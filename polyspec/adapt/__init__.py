"""`polyspec adapt`: closed-loop adaptation (docs/adaptation.md). The command is polyspec.adapt.cli; a cycle
(polyspec.adapt.cycle) runs triggers, training, the gate, the canary and the swap or rollback."""
