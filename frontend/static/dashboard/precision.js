// How a stage's precision reads on the dashboard: one precision ("16-bit", "int8"), or a stage
// whose last layers run lower (low_bits from layer low_from on: "16-bit · int4 from L24").
export const bitsLabel = (b) => (b === 16 ? "16-bit" : `int${b}`);

export function precisionLabel(stage) {
  const main = bitsLabel(stage.bits);
  return stage.low_bits ? `${main} · ${bitsLabel(stage.low_bits)} from L${stage.low_from}` : main;
}
