"""The parts a mechanism is built from, and the plan they add up to.

`batch_selection` (which examples a step sees), `clipping` (each example's bound, hence the sum's
sensitivity) and `noise_addition` (the release's noise) each declare their share of the privacy event;
`plan` bundles them (`Parts`) with the DpEvent they compose to (`PrivacyPlan`). Kept apart from the
catalogue mechanisms so that a new mechanism is visibly a new combination of these parts. Importing this
package loads nothing: each module is imported where it is used.
"""
