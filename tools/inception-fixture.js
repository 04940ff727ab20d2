// Test-data generator (not part of the build): runs nsfwjs's InceptionV3 in TensorFlow.js and stores reference
// activations that tests/test_inception.cpp compares with sat's oneDNN network.
//   usage: node tools/inception-fixture.js <nsfwjs>/dist/models/inception_v3 <out.safetensors> <image.ppm>...
//   each image: binary PPM (P6), RGB; its pixels are stored in the fixture as the test's input. The first image
//   gets mixed5 and mixed7 activations, the others mixed5 only (keeps the fixture small).
// Needs `npm install @tensorflow/tfjs@4` (pure JavaScript CPU backend); tools/make-inception-fixture.sh does all.
const fs = require('fs');
const path = require('path');
const tf = require('@tensorflow/tfjs');

function readPpm(file) {
  const b = fs.readFileSync(file);
  const tokens = [];
  let i = 0;
  while (tokens.length < 4) {
    while (/\s/.test(String.fromCharCode(b[i]))) i++;
    if (b[i] === 35) { while (b[i] !== 10) i++; continue; }  // comment
    let s = '';
    while (!/\s/.test(String.fromCharCode(b[i]))) s += String.fromCharCode(b[i++]);
    tokens.push(s);
  }
  i++;
  if (tokens[0] !== 'P6' || tokens[3] !== '255') throw new Error(file + ': not an 8-bit binary PPM');
  const w = +tokens[1], h = +tokens[2];
  return {w, h, data: b.subarray(i, i + w * h * 3)};
}

async function main() {
  const [dir, out, ...images] = process.argv.slice(2);
  const m = require(path.resolve(dir, 'model.min.js'));
  const topo = JSON.parse(JSON.stringify(m.modelTopology));
  const cfg = topo.model_config.config;
  const keep = cfg.layers.findIndex(l => l.name === 'mixed7');
  cfg.layers = cfg.layers.slice(0, keep + 1);
  cfg.layers[0].config.batch_input_shape = [null, null, null, 3];  // any input size
  cfg.output_layers = [['mixed5', 0, 0], ['mixed7', 0, 0]];
  const manifest = m.weightsManifest[0];
  const shards = manifest.paths.map(p => Buffer.from(require(path.resolve(dir, p + '.min.js')), 'base64'));
  const all = Buffer.concat(shards);
  const weightData = all.buffer.slice(all.byteOffset, all.byteOffset + all.length);
  const model = await tf.loadLayersModel(
      tf.io.fromMemory({modelTopology: topo, weightSpecs: manifest.weights, weightData}), {strict: false});

  const tensors = [];  // [name, dtype, shape, Buffer]
  const quant = {};
  images.forEach((file, k) => {
    const img = readPpm(file);
    tensors.push([`image${k}`, 'U8', [img.h, img.w, 3], Buffer.from(img.data)]);
    quant[`image${k}`] = [0, 1];
    const x = tf.tidy(() => tf.tensor4d(Float32Array.from(img.data), [1, img.h, img.w, 3]).div(255));  // RGB / 255
    const [m5, m7] = model.predict(x);
    for (const [name, t] of k === 0 ? [['mixed5', m5], ['mixed7', m7]] : [['mixed5', m5]]) {
      const v = t.dataSync();
      tensors.push([`image${k}.${name}`, 'F32', t.shape.slice(1), Buffer.from(v.buffer, v.byteOffset, v.byteLength)]);
    }
    console.log(file, img.w + 'x' + img.h, 'mixed5', m5.shape.slice(1), k === 0 ? 'mixed7 ' + m7.shape.slice(1) : '');
  });
  const header = {__metadata__: {format: 'sat-inception-fixture', quantization: JSON.stringify(quant),
                                 generator: 'tools/inception-fixture.js, @tensorflow/tfjs ' + tf.version.tfjs}};
  let offset = 0;
  for (const [name, dtype, shape, buf] of tensors) {
    header[name] = {dtype, shape, data_offsets: [offset, offset + buf.length]};
    offset += buf.length;
  }
  let h = JSON.stringify(header);
  while ((h.length + 8) % 8) h += ' ';
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(h.length));
  fs.writeFileSync(out + '.tmp', Buffer.concat([len, Buffer.from(h), ...tensors.map(t => t[3])]));
  fs.renameSync(out + '.tmp', out);
}
main().catch(e => { console.error(e.message); process.exit(1); });
