//! iolab-tokio-server: the tokio + hyper peer served beside iolab's models.

fn main() {
    eprintln!("iolab-tokio-server is not written yet");
    std::process::exit(2);
}
